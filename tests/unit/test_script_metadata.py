"""A module's PEP 723 block as the daemon reads it (``environments/script.py``): what it declares,
what it refuses with the line of the block, and ``requires-python`` against a Python version."""

from __future__ import annotations

import pytest

from atomictoolsd.environments.script import ScriptError, parse_metadata, python_meets

BLOCK = '''"""A tool."""
# /// script
# requires-python = ">=3.11"
# dependencies = [
#   "pyyaml>=6",
#   "httpx",  # a comment
# ]
#
# [tool.uv]
# exclude-newer = "2025-01-01T00:00:00Z"
# ///
import yaml
'''


def test_a_block_gives_its_dependencies_python_and_line() -> None:
    metadata = parse_metadata(BLOCK)
    assert metadata is not None
    assert metadata.dependencies == ("pyyaml>=6", "httpx")
    assert metadata.requires_python == ">=3.11" and metadata.line == 2


@pytest.mark.parametrize("source", [
    "import yaml\n",
    "# /// pyproject\n# x = 1\n# ///\n",  # another type of block
    "#/// script\n# dependencies = []\n#///\n",  # not the marker
])
def test_no_script_block_is_none(source: str) -> None:
    assert parse_metadata(source) is None


@pytest.mark.parametrize(("source", "says"), [
    ("x = 1\n# /// script\n# dependencies = [\n# ///\n", "not valid TOML"),
    ("# /// script\n# dependencies = \"pyyaml\"\n# ///\n", "must be a list of strings"),
    ('# /// script\n# dependencies = ["--index-url=https://elsewhere"]\n# ///\n', "is not a requirement"),
    ('# /// script\n# dependencies = ["-r other.txt"]\n# ///\n', "is not a requirement"),
    ("# /// script\n# requires-python = 3.11\n# ///\n", "must be a string"),
    ("# /// script\n# dependencies = []\n# ///\nx = 1\n# /// script\n# dependencies = []\n# ///\n",
     "two `# /// script` blocks"),
    # Read on the daemon's event loop: a block of 3.5 MB took tomllib 2 s.
    ("x = 1\n# /// script\n# dependencies = []\n" + "".join(f"# k{i} = {i}\n" for i in range(200_000)) + "# ///\n",
     "larger than 64 KiB"),
])
def test_a_block_that_cannot_be_used_names_why_and_its_line(source: str, says: str) -> None:
    with pytest.raises(ScriptError, match=says) as refused:
        parse_metadata(source)
    assert refused.value.line == source.split("\n").index("# /// script") + 1


@pytest.mark.parametrize(("specifier", "met"), [
    (">=3.11", True), (">=3.12", False), ("<3.12", True), ("<=3.11", False), ("<=3.11.6", False),
    (">3.11", True), (">3.11.7", False), ("==3.11.*", True), ("==3.12.*", False), ("!=3.11.*", False),
    ("==3.11.7", True), ("==3.11", False), ("~=3.10", True), ("~=3.11.0", True), ("~=3.11.8", False),
    (">=3.9, <3.13", True), (">=3.9,<3.11", False),
])
def test_requires_python_against_a_version(specifier: str, met: bool) -> None:
    assert python_meets(specifier, (3, 11, 7)) is met


@pytest.mark.parametrize("specifier", [">=3.11a1", "~=3", ">=3.*", "python>=3"])
def test_a_requires_python_that_cannot_be_read_is_an_error(specifier: str) -> None:
    with pytest.raises(ValueError):
        python_meets(specifier, (3, 11, 7))


@pytest.mark.parametrize("dependency", [
    "http://127.0.0.1:8765/evil-1.0.tar.gz",  # pip builds a URL's source tree even with --only-binary
    "./pkg", "/abs/pkg", "../pkg", "~/pkg",  # a path: a source tree the repository holds
    "evil-1.0.tar.gz", "evil-1.0-py3-none-any.whl",  # an archive's file name
    "git+https://example.com/a/b", "file:///tmp/pkg",
    "pkg --config-settings=x", "pkg==1.0 --hash=sha256:00",  # a requirements file's per-line options
])
def test_a_url_a_path_or_an_option_is_not_a_requirement(dependency: str) -> None:
    source = f'# /// script\n# dependencies = ["{dependency}"]\n# ///\n'
    with pytest.raises(ScriptError, match="is not a requirement of a package index"):
        parse_metadata(source)


@pytest.mark.parametrize("dependency", [
    "pyyaml>=6", "httpx[http2]>=0.27 ; python_version >= '3.11'", "zope.interface", "foo (>=1.0)",
    "Foo_Bar-baz~=1.2", "name @ https://example.com/name-1.0-py3-none-any.whl",
])
def test_a_requirement_by_name_is_taken(dependency: str) -> None:
    source = f'# /// script\n# dependencies = ["{dependency}"]\n# ///\n'
    metadata = parse_metadata(source)
    assert metadata is not None and metadata.dependencies == (dependency,)
