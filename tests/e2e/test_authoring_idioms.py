"""What authors bring from FastMCP and pydantic works, through a real daemon: ``Field(...)`` as a
parameter's default (its constraints, and its default when it has one), and a plain string in
``Annotated`` as the description, also inside ``Optional``/``| None``/``list``, and constraints on an
optional parameter. The schema the client lists shows them and validation applies; what would be
misread (pydantic's positional default for ``atomictools.Field``) is the module's load error; ``pydantic.Field``
is read by pydantic."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import Env

IDIOMS = '''
from typing import Annotated
from atomictools import Field, tool

@tool
def repeat(
    text: Annotated[str, "The text to repeat"],
    count: int = Field(ge=0),
    sep: str = Field("What goes between", min_length=1, default=","),
    width: Annotated[int, Field("Pad each to this width", ge=1, le=9, default=1)] = 1,
) -> str:
    return sep.join([text.ljust(width)] * count)
'''


def test_field_as_a_default_and_a_string_in_annotated_reach_the_schema_and_validation(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "repeat.py", IDIOMS)
    daemon = make_daemon()
    with daemon.client() as client:
        listing = client.request("atomic/list")
        assert listing["errors"] == [], listing["errors"]
        (tool,) = client.list_tools()
        schema = tool["inputSchema"]
        assert schema["required"] == ["text", "count"]
        props = schema["properties"]
        assert props["text"] == {"type": "string", "description": "The text to repeat"}
        assert props["count"] == {"type": "integer", "minimum": 0}
        assert props["sep"] == {"type": "string", "description": "What goes between", "minLength": 1, "default": ","}
        assert props["width"]["minimum"] == 1 and props["width"]["maximum"] == 9 and props["width"]["default"] == 1
        assert props["width"]["description"] == "Pad each to this width"

        assert client.call("repeat", text="a", count=3).text == "a,a,a"
        assert client.call("repeat", text="a", count=2, sep="-", width=2).text == "a -a "
        refused = client.call("repeat", text="a", count=-1)
        assert refused.is_error and "count" in refused.text and ">= 0" in refused.text, refused.text
        refused = client.call("repeat", text="a")
        assert refused.is_error and "count" in refused.text, refused.text
        refused = client.call("repeat", text="a", count=1, sep="")
        assert refused.is_error and "sep" in refused.text, refused.text


VARIANTS = '''
from typing import Annotated, Optional
from atomictools import Field, tool

@tool
def find(
    path: Annotated[str, "The path"] | None = None,
    root: Optional[Annotated[str, "Where to start"]] = None,
    names: list[Annotated[str, "A file name"]] = [],
    limit: int | None = Field("At most this many", default=None, ge=1),
    depth: Annotated[int, "How deep"] | None = Field(default=None, le=3),
) -> str:
    return f"{path} {root} {names} {limit} {depth}"
'''


def test_descriptions_and_constraints_reach_optional_and_nested_parameters(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.local_tools, "find.py", VARIANTS)
    daemon = make_daemon()
    with daemon.client() as client:
        listing = client.request("atomic/list")
        assert listing["errors"] == [], listing["errors"]
        (tool,) = client.list_tools()
        props = tool["inputSchema"]["properties"]
        assert props["path"]["description"] == "The path"
        assert props["root"]["description"] == "Where to start"
        assert props["names"]["items"] == {"type": "string", "description": "A file name"}
        # The description is the parameter's; the constraint is its value's (None stays allowed).
        assert props["limit"]["description"] == "At most this many"
        assert {"type": "integer", "minimum": 1} in props["limit"]["anyOf"], props["limit"]
        assert props["depth"]["description"] == "How deep"
        assert {"type": "integer", "maximum": 3} in props["depth"]["anyOf"], props["depth"]

        assert client.call("find", names=["a"], limit=2).text == "None None ['a'] 2 None"
        assert client.call("find", limit=None, depth=3).text == "None None [] None 3"
        refused = client.call("find", limit=0)
        assert refused.is_error and "limit" in refused.text and ">= 1" in refused.text, refused.text
        refused = client.call("find", depth=4)
        assert refused.is_error and "depth" in refused.text, refused.text


REFUSED = {
    # pydantic's positional default: Field's first argument is the description here.
    "positional.py": '''
from atomictools import Field, tool

@tool
def positional(count: int = Field(5, ge=0)) -> str:
    return str(count)
''',
}


def test_what_would_be_misread_is_refused_at_load_naming_the_form_to_write(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("pydantic")
    for filename, source in REFUSED.items():
        env.write_tool(env.local_tools, filename, source)
    daemon = make_daemon()
    with daemon.client() as client:
        listing = client.request("atomic/list")
        assert client.list_tools() == []
        errors = {Path(e["file"]).name: e["message"] for e in listing["errors"]}
        assert set(errors) == set(REFUSED), listing["errors"]
        assert "Field(default=5" in errors["positional.py"], errors


PYDANTIC = {
    "pydantic_default.py": '''
import pydantic
from atomictools import tool

@tool
def pydantic_default(count: int = pydantic.Field(description="How many", ge=0)) -> str:
    return str(count)
''',
    "pydantic_annotated.py": '''
from typing import Annotated
import pydantic
from atomictools import tool

@tool
def pydantic_annotated(count: Annotated[int, pydantic.Field(description="How many", ge=0)] = 1) -> str:
    return str(count)
''',
    "pydantic_nested.py": '''
from typing import Annotated
import pydantic
from atomictools import tool

@tool
def pydantic_nested(counts: list[Annotated[int, pydantic.Field(ge=0)]]) -> str:
    return str(counts)
''',
}


def test_pydantic_fields_are_read_as_pydantic_reads_them(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("pydantic")
    for filename, source in PYDANTIC.items():
        env.write_tool(env.local_tools, filename, source)
    daemon = make_daemon()
    with daemon.client() as client:
        tools = {t["name"]: t["inputSchema"] for t in client.list_tools()}
        assert tools["pydantic_default"]["properties"]["count"]["description"] == "How many"
        assert tools["pydantic_default"]["required"] == ["count"]
        assert tools["pydantic_annotated"]["properties"]["count"]["default"] == 1
        assert tools["pydantic_nested"]["properties"]["counts"]["items"]["minimum"] == 0
        assert client.call("pydantic_default", count=2).text == "2"
        refused = client.call("pydantic_nested", counts=[1, -1])
        assert refused.is_error and "`counts.1`" in refused.text, refused.text
