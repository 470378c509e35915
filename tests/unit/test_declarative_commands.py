"""Where a shell template's values land (commands.check), and what an http value may do to a URL."""

from __future__ import annotations

import shlex
import urllib.parse

import pytest

from atomictools import ToolError
from atomictoolsd.worker.declarative.commands import Unsafe, check, program_name
from atomictoolsd.worker.declarative.http_request import HttpHandler
from atomictoolsd.worker.declarative.shell import ShellHandler
from atomictoolsd.worker.declarative.templates import TemplateError, ValueRejected


def role(command: str) -> str | None:
    """The role that refuses a placeholder of ``command`` whatever its schema; ``guarded`` when its
    value must be constrained by the schema; None when free text may go everywhere it is put."""
    try:
        reading = check(shlex.split(command))
    except Unsafe as exc:
        return exc.role
    return "guarded" if reading.guards else None


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        # The issue's walk-arounds.
        ("perl -ne 'print if /{{p}}/'", "code"),
        ("perl -lne 'print {{p}}'", "code"),
        ("node -pe '{{e}}'", "code"),
        ("env -S 'sh -c \"echo {{v}}\"'", "line"),
        ("sh -c -- 'echo {{v}}'", "code"),
        # Clusters, options between, options read after the code.
        ("bash -euxc 'echo {{v}}'", "code"),
        ("sh -c -e 'echo {{v}}'", "code"),
        ("zsh -o errexit -c 'echo {{v}}'", "code"),
        ("python3 -Ic '{{v}}'", "code"),
        ("perl -e{{v}}", "code"),
        ("node --eval={{v}}", "code"),
        ("perl -e 'print @ARGV' {{v}}", "guarded"),  # where options are still read: a value -e… would be one
        ("node -e 'x' {{v}}", "guarded"),
        ("sed -n p {{v}}", "guarded"),
        ("python3 -X {{v}} s.py", "option"),  # an interpreter's own option's argument: never
        ("perl -{{v}} s.pl", "option"),
        # The program, a script or a module chosen by the value.
        ("{{prog}} x", "program"),
        ("timeout 5 {{prog}}", "program"),
        ("find . -exec {{prog}} ;", "program"),
        ("python3 {{script}}", "script"),
        ("python3 -m {{module}}", "script"),
        ("perl -M{{module}} s.pl", "script"),
        # Wrappers in front, by path and versioned name.
        ("sudo -u root nice -n 5 env A=1 /usr/bin/python3.11 -c 'print({{v}})'", "code"),
        ("xargs -0 perl5.36 -e '{{v}}'", "code"),
        ("find . -exec sh -c 'echo {{v}}' ;", "code"),
        ("env -S 'sh -c' {{v}}", "code"),
        ("busybox sh -c '{{v}}'", "code"),
        # Command lines handed to a shell, and variables chosen by the value.
        ("ssh host ls {{dir}}", "line"),
        ("watch echo {{v}}", "line"),
        ("su -c 'echo {{v}}'", "code"),
        ("flock /tmp/l -c 'echo {{v}}'", "code"),
        ("env {{name}}=1 sh s.sh", "variable"),
        ("timeout {{t}} true", "guarded"),
        # The issue's walk-arounds of the table: arguments a program reads as more than data, and
        # programs the table did not know.
        ("make -- {{target}}", "guarded"),  # NAME=VALUE sets a variable (.SHELLFLAGS)
        ("perl -ne 'print' -- {{file}}", "guarded"),  # "x|" is a command to perl's two-argument open
        ("perl -e 'print @ARGV' -- {{v}}", "guarded"),
        ("awk '{print}' {{file}}", "guarded"),  # an operand v=x assigns the program's variable
        ("mytool {{x}}", "guarded"),
        ("git checkout -b {{name}}", "guarded"),
        ("docker run alpine {{v}}", "guarded"),
        ("ipython -c {{v}}", "code"),
        ("python3-dbg -c {{v}}", "code"),
        ("python3.12d -c {{v}}", "code"),
        ("dc -e {{v}}", "code"),
        ("xonsh -c {{v}}", "code"),
        ("nu -c {{v}}", "code"),
        ("uv run {{v}}", "program"),
        ("uv run --with {{v}} x", "program"),
        ("pipx run {{v}}", "program"),
        ("npm exec {{v}}", "program"),
        ("npm exec -c {{v}}", "code"),
        ("npm run {{v}}", "script"),
        ("prlimit --nofile=10 {{v}}", "program"),
        ("setarch x86_64 -R {{v}}", "program"),
        ("systemd-run --property={{v}} true", "guarded"),  # ExecStartPre=… would run a command
        ("make -f {{file}}", "script"),
        ("make --eval={{v}}", "code"),
        ("git -c {{v}} log", "code"),
        ("git -C {{dir}} log", "script"),
        ("git {{sub}}", "script"),
        ("git grep -O{{v}} x", "option"),
        ("git grep --open-files-in-pager={{v}} x", "program"),
        ("git log --output={{f}} -1", "guarded"),
        ("sort -o {{f}} x", "guarded"),
        ("env -P {{path}} ls", "program"),
        # Free text: the value after the code, behind -- where options are still read, or data to a
        # program whose arguments are data.
        ("sh -c 'echo \"$1\"' sh {{v}}", None),
        ("bash -lc 'grep -- \"$1\" f' bash {{v}}", None),
        ("perl -ne 'print if /$ENV{X}/' f", None),
        ("node -e 'console.log(process.argv[1])' -- {{v}}", None),
        ("python3 -c 'import sys; print(sys.argv[1])' {{v}}", None),
        ("python3 tool.py --name {{v}}", None),
        ("awk -v pat={{v}} '$0 ~ pat' f", None),
        ("sed -n p -- {{v}}", None),
        ("timeout -- {{t}} true", None),
        ("nice -n {{n}} grep -- x y", None),
        ("env A={{v}} printenv A", None),
        ("find . -name {{v}} -exec grep -l x {} +", None),
        ("grep -rn -- {{v}} .", None),
        ("git log -n {{count}} -- {{path}}", None),
        ("git log '--format=%h {{fmt}}' --author={{who}} -- {{paths}}", None),
        ("git grep -n -e {{p}} -- {{path}}", None),
        ("echo {{v}}", None),
        ("ls {{dir}}", None),
        ("printf '[%s]' {{v}} --opt={{v}}", None),
        ("rg -e {{p}} -- {{path}}", None),
        ("date -d {{when}} +%s", None),
        ("timeout 5 grep -c -- {{v}} f", None),
    ],
)
def test_where_a_value_lands(command: str, expected: str | None) -> None:
    assert role(command) == expected


def test_program_names() -> None:
    assert [program_name(w) for w in ("/usr/bin/python3.11", "perl5.36", "python3.13t", "lua5.4", "gawk", "grep")] == [
        "python", "perl", "python", "lua", "gawk", "grep"]
    # A plain program is its exact name: diff3 (which runs --diff-program) is not diff, lsd not ls.
    assert [program_name(w) for w in ("diff3", "/usr/bin/diff3", "lsd", "grep2")] == ["diff3", "diff3", "lsd", "grep2"]
    assert role("diff3 {{files}}") == "guarded"  # a value "--diff-program=./x" would run ./x


def test_an_unknown_option_is_read_both_ways() -> None:
    # -Z is not in python's table: if it takes the next word, {{v}} is the script.
    assert role("python3 -Z s.py {{v}}") == "script"
    assert role("python3 -u s.py {{v}}") is None


def test_the_refusal_says_what_to_do_instead() -> None:
    with pytest.raises(TemplateError) as info:
        ShellHandler(command="perl -lne 'print if /{{p}}/'")
    assert "inside the code that perl runs" in str(info.value)
    assert "env P={{p}} perl ... (perl: $ENV{P})" in str(info.value)
    with pytest.raises(TemplateError) as info:
        ShellHandler(command="bash -ec 'grep {{p}} f'")
    assert "bash -c '... \"$1\" ...' bash {{p}}" in str(info.value)
    with pytest.raises(TemplateError, match=r"where python reads its own options .* behind --"):
        ShellHandler(command="python3 -X {{p}} s.py")
    free = {"type": "object", "properties": {"p": {"type": "string"}}}
    with pytest.raises(TemplateError) as info:
        ShellHandler(command="perl -e 'print @ARGV' {{p}}").check_schema(free)
    message = str(info.value)
    assert "{{p}}, whose schema lets it be any text, where perl still reads its own options" in message
    assert "Constrain 'p' in inputSchema instead" in message and '"unsafeFreeText": ["p"]' in message
    free_t = {"type": "object", "properties": {"t": {"type": "string"}}}
    with pytest.raises(TemplateError, match=r"in an argument of make \('\{\{t\}\}', word 3 of the command\) that make may read as more"):
        ShellHandler(command="make -- {{t}}").check_schema(free_t)
    with pytest.raises(TemplateError, match=r"in an argument of mytool \('\{\{t\}\}', word 3 of the command\), a program whose reading"):
        ShellHandler(command="mytool -- {{t}}").check_schema(free_t)


@pytest.mark.parametrize(
    ("schema", "loads"),
    [
        ({"type": "string"}, False),
        ({"type": "string", "maxLength": 20}, False),
        ({"type": "string", "pattern": "^[a-z][a-z0-9_-]*$"}, True),
        ({"type": "string", "pattern": "^[a-z0-9_-]+$"}, False),  # may start with -
        ({"type": "string", "pattern": "^[^-+][^=|]*$"}, False),  # may hold < or >
        ({"type": "string", "pattern": "[a-z]+"}, False),  # not anchored: a search finds it inside anything
        ({"type": "string", "pattern": "^(?!-)[A-Za-z0-9_./-]+$"}, True),
        ({"type": "string", "format": "date-time"}, True),
        ({"type": "string", "format": "email"}, False),
        ({"enum": ["all", "-k clean"]}, True),  # the author's own values
        ({"type": "integer", "minimum": 0}, True),
        ({"type": "integer"}, False),  # -5 would be an option
        ({"type": ["string", "null"], "pattern": "^[a-z]+$"}, True),
        ({"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}}, True),
        ({"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"type": "string"}]}, False),
        ({"pattern": "^[a-z]+$"}, False),  # untyped: a number is no string, the pattern never applies
    ],
)
def test_a_guarded_value_loads_when_its_schema_constrains_it(schema: dict, loads: bool) -> None:  # type: ignore[type-arg]
    handler = ShellHandler(command="make -- {{t}}")
    try:
        handler.check_schema({"type": "object", "properties": {"t": schema}})
    except TemplateError:
        assert not loads, schema
    else:
        assert loads, schema


def test_unsafe_free_text_is_the_authors_say_and_names_used_parameters() -> None:
    free = {"type": "object", "properties": {"t": {"type": "string"}}}
    ShellHandler(command="make -- {{t}}", unsafe_free_text=["t"]).check_schema(free)
    with pytest.raises(TemplateError, match="which handler.command does not use"):
        ShellHandler(command="make -- {{t}}", unsafe_free_text=["x"])
    with pytest.raises(TemplateError, match="inside the code"):  # never where a program runs it
        ShellHandler(command="sh -c {{t}}", unsafe_free_text=["t"])


def test_a_list_cannot_become_several_words_where_a_program_reads_one() -> None:
    # nice -n 5 sh -c 'touch x' would run a command the template never wrote.
    for command in ("nice -n {{v}} grep -- x f", "timeout -- {{v}} true", "find . -name {{v}}"):
        with pytest.raises(ValueRejected, match="is a list, but the command takes exactly one argument there"):
            ShellHandler(command=command).argv("t", {"v": ["5", "sh", "-c", "touch x"]})
    assert ShellHandler(command="sh -c 'echo \"$@\"' sh {{v}}").argv("t", {"v": ["a", "b"]})[-2:] == ["a", "b"]
    assert ShellHandler(command="nice -n {{v}} grep -- x f").argv("t", {"v": "5"})[:3] == ["nice", "-n", "5"]


@pytest.mark.parametrize(
    "value",
    [".", "..", "%2e", "%2E%2e", ".%2e", "a/../b", "..\\x", "\\..", "..;x", "..%00", "... ", "", "x/.", "%2e%2e%2f",
     "..%5c"],
)
def test_a_value_cannot_make_a_dot_segment(value: str) -> None:
    handler = HttpHandler(url="http://h/api/items/{{id}}/details")
    with pytest.raises(ToolError, match=r"^Refused: the value of \{\{id\}\} would make a URL path segment"):
        handler.build_url({"id": value})


@pytest.mark.parametrize("value", ["a.b", ".hidden", "v1.2", "...x", "@evil:1", "#f", "?a=1&b=2", "//x", "a b", "ü"])
def test_a_value_never_changes_scheme_host_port_or_query(value: str) -> None:
    url = HttpHandler(url="https://h.example:8443/api/{{id}}/x?a={{id}}&b=1").build_url({"id": value})
    parts = urllib.parse.urlsplit(url)
    assert (parts.scheme, parts.hostname, parts.port) == ("https", "h.example", 8443)
    assert parts.path.split("/")[1::2] == ["api", "x"] and len(parts.path.split("/")) == 4
    assert urllib.parse.parse_qs(parts.query) == {"a": [value], "b": ["1"]}
    assert parts.fragment == ""


@pytest.mark.parametrize(
    ("command", "cwd", "needs"),
    [
        # Programs that run nothing a directory names, found on PATH: anywhere.
        ("grep -rn -e {{p}} -- .", None, None),
        ("rg --json -- {{p}}", None, None),
        ("/usr/bin/grep x .", None, "."),  # a path: whatever file is there
        ("find . -name {{n}}", None, None),
        ("jq . data.json", "sub", None),
        # Any other program may run what the directory holds.
        ("git status --short", None, "."),
        ("git status --short", "src", "src"),  # relative to the caller's directory
        ("make test", None, "."),
        ("npm test", None, "."),
        ("python3 -m pytest", None, "."),
        ("./build.sh", None, "."),
        ("bin/grep x .", None, "."),
        ("env grep x .", None, "."),  # a wrapper: what it runs is not looked into
        ("timeout 5 grep x .", None, "."),
        # The options of an inert program that run one.
        ("find . -name x -exec cat {} +", None, "."),
        ("find . -execdir cat {} ;", None, "."),
        ("rg --pre ./decode x", None, "."),
        ("rg --pre=./decode x", None, "."),
        ("sort --compress-program=./z big.txt", None, "."),
        ("sort --compress=./z big.txt", None, "."),  # GNU long options take a prefix
        ("sort --check big.txt", None, None),
        ("rg --hostname-bin=./h x", None, "."),
        # A name that only looks like an inert one: diff3 runs --diff-program.
        ("diff3 a b c", None, "."),
        ("lsd .", None, "."),
        # A directory of its own, not the caller's.
        ("git status --short", "/srv/repo", None),
        ("git status --short", "~/notes", None),
    ],
)
def test_a_command_needs_a_trusted_directory_where_it_may_run_what_the_directory_holds(
    command: str, cwd: str | None, needs: str | None
) -> None:
    handler = ShellHandler(command=command, cwd=cwd)
    assert handler.needs_trusted_directory == needs


def test_free_text_an_inert_program_reads_as_options_needs_a_trusted_directory() -> None:
    handler = ShellHandler(command="rg {{args}} .", unsafe_free_text=["args"])  # "--pre=./x" is one such value
    assert handler.needs_trusted_directory == "."
    assert ShellHandler(command="make", cwd="src/../..").needs_trusted_directory == ".."
