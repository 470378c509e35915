"""What authors bring from FastMCP and pydantic works, through a real daemon: ``Field(...)`` as a
parameter's default (its constraints, and its default when it has one), and a plain string in
``Annotated`` as the description. The schema the client lists shows them and validation applies."""

from __future__ import annotations

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
