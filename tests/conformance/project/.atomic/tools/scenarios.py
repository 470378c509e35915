"""The tools the official conformance suite's server scenarios call, written with the public
authoring API only (``atomictools``): each returns or does what its scenario's description asks."""

import json
import struct
import time
from typing import Literal

import msgspec

from atomictools import Audio, Context, Image, Resource, tool

# A 1x1 red PNG, and a WAV of eight silent samples.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d763f8cfc0"
    "000003010100c9fe92ef0000000049454e44ae426082"
)
WAV = (b"RIFF" + struct.pack("<I", 36 + 8) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 8000, 8000, 1, 8)
       + b"data" + struct.pack("<I", 8) + b"\x80" * 8)


@tool(name="test_simple_text")
def simple_text() -> str:
    """A plain text answer."""
    return "This is a simple text response for testing."


@tool(name="test_image_content")
def image_content() -> Image:
    """A 1x1 PNG."""
    return Image(PNG)


@tool(name="test_audio_content")
def audio_content() -> Audio:
    """A short WAV."""
    return Audio(WAV)


@tool(name="test_embedded_resource")
def embedded_resource() -> Resource:
    """A text resource embedded in the result."""
    return Resource(uri="test://embedded-resource", text="This is an embedded resource content.", mime_type="text/plain")


@tool(name="test_multiple_content_types")
def multiple_content_types():
    """Text, an image and a JSON resource, in that order."""
    return [
        "Multiple content types test:",
        Image(PNG),
        Resource(uri="test://mixed-content-resource", text='{"test":"data","value":123}', mime_type="application/json"),
    ]


@tool(name="test_tool_with_logging")
def with_logging(ctx: Context) -> str:
    """Three info logs, 50 ms apart."""
    ctx.log("info", "Tool execution started")
    time.sleep(0.05)
    ctx.log("info", "Tool processing data")
    time.sleep(0.05)
    ctx.log("info", "Tool execution completed")
    return "Logging test completed"


@tool(name="test_error_handling")
def error_handling() -> str:
    """Always fails."""
    raise RuntimeError("This tool intentionally returns an error for testing")


@tool(name="test_tool_with_progress")
def with_progress(ctx: Context) -> str:
    """Progress 0, 50 and 100 of 100, 50 ms apart."""
    for step in (0, 50, 100):
        ctx.progress(step, 100)
        if step < 100:
            time.sleep(0.05)
    return "Progress test completed"


@tool(name="test_sampling", timeout=60)
def sampling(ctx: Context, prompt: str) -> str:
    """Ask the client's model."""
    reply = ctx.sample(prompt, max_tokens=100)
    return f"LLM response: {reply.text}"


@tool(name="test_elicitation", timeout=60)
def elicitation(ctx: Context, message: str) -> str:
    """Ask the user for a name and an email."""
    answer = ctx.elicit(message, {
        "type": "object",
        "properties": {
            "username": {"type": "string", "description": "User's response"},
            "email": {"type": "string", "description": "User's email address"},
        },
        "required": ["username", "email"],
    })
    return f"User response: action={answer.action}, content={json.dumps(answer.content)}"


class Profile(msgspec.Struct):
    name: str = "John Doe"
    age: int = 30
    score: float = 95.5
    status: Literal["active", "inactive", "pending"] = "active"
    verified: bool = True


@tool(name="test_elicitation_sep1034_defaults", timeout=60)
def elicitation_defaults(ctx: Context) -> str:
    """Ask for a profile whose every field has a default (SEP-1034)."""
    answer = ctx.elicit("Please review and update the form fields with defaults", Profile)
    content = msgspec.to_builtins(answer.content) if answer.accepted else None
    return f"Elicitation completed: action={answer.action}, content={json.dumps(content)}"


ENUMS = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {"type": "string", "oneOf": [
            {"const": "value1", "title": "First Option"},
            {"const": "value2", "title": "Second Option"},
            {"const": "value3", "title": "Third Option"},
        ]},
        "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"],
                       "enumNames": ["Option One", "Option Two", "Option Three"]},
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
        "titledMulti": {"type": "array", "items": {"anyOf": [
            {"const": "value1", "title": "First Choice"},
            {"const": "value2", "title": "Second Choice"},
            {"const": "value3", "title": "Third Choice"},
        ]}},
    },
}


@tool(name="test_elicitation_sep1330_enums", timeout=60)
def elicitation_enums(ctx: Context) -> str:
    """Ask with every enum form of SEP-1330."""
    answer = ctx.elicit("Pick options", ENUMS)
    return f"Elicitation completed: action={answer.action}, content={json.dumps(answer.content)}"


@tool(name="test_reconnection")
def reconnection() -> str:
    """Answers at once (the suite then checks the JSON answer, as SSE resumption is optional)."""
    return "Reconnection test completed"
