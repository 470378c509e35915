"""Tool results that are not text: images, audio, embedded resources and resource links, alone or
mixed with text, from bytes or a path, through a real daemon and its workers, to the official MCP
client over the shim, the tiny client, and the dispatcher's meta-tools."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from atomictools import Image, Resource, ResourceLink
from helpers import Daemon, Env, serving
from shim_helpers import mcp_session, run

# A 1x1 red PNG, and a WAV of 8 silent samples.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d763f8cfc0"
    "000003010100c9fe92ef0000000049454e44ae426082"
)
WAV = b"RIFF" + struct.pack("<I", 36 + 8) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 8000, 8000, 1, 8) + b"data" + struct.pack("<I", 8) + b"\x80" * 8

KIT = '''
import os
from atomictools import Audio, Context, Image, Resource, ResourceLink, tool

HERE = os.path.dirname(__file__)
PNG = bytes.fromhex("PNG_HEX")
WAV = bytes.fromhex("WAV_HEX")


@tool(name="test_image_content")
def image() -> Image:
    """A 1x1 PNG, from bytes (its type guessed from them)."""
    return Image(PNG)


@tool(name="test_audio_content")
def audio() -> Audio:
    """A WAV, from bytes."""
    return Audio(WAV)


@tool(name="test_embedded_resource")
def embedded() -> Resource:
    """A text resource embedded in the result."""
    return Resource(uri="test://embedded-resource", text="This is an embedded resource content.")


@tool(name="test_multiple_content_types")
def mixed():
    """Text, an image and a JSON resource, in order."""
    return [
        "Multiple content types test:",
        Image(PNG),
        Resource(uri="test://mixed-content-resource", text='{"test":"data","value":123}', mime_type="application/json"),
    ]


@tool
def from_path(name: str):
    """An image read from a file beside this module, its type from the file name or its bytes."""
    return [Image(os.path.join(HERE, name)), ResourceLink(os.path.join(HERE, name))]


@tool
def big(size: int) -> Image:
    """A PNG padded to ``size`` bytes."""
    return Image(PNG + bytes(size - len(PNG)))


@tool
def nameless() -> Image:
    """Bytes whose type cannot be told."""
    return Image(b"not an image")
'''.replace("PNG_HEX", PNG.hex()).replace("WAV_HEX", WAV.hex())


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module's tests that call the media tools and read their blocks."""
    env = Env(tmp_path_factory.mktemp("media"))
    env.write_tool(env.global_tools, "media.py", KIT)
    (env.global_tools / "dot.png").write_bytes(PNG)
    (env.global_tools / "raw.bin").write_bytes(PNG)  # no telling extension: the bytes say PNG
    with serving(env) as daemon:
        yield daemon


def test_each_content_kind_reaches_the_official_client_over_the_shim(kit: Daemon) -> None:
    env = kit.env
    async def scenario() -> None:
        async with mcp_session(env) as (session, _):
            image = await session.call_tool("test_image_content", {})
            assert not image.is_error
            [block] = image.content
            assert block.type == "image" and block.mime_type == "image/png"
            assert base64.b64decode(block.data) == PNG

            audio = await session.call_tool("test_audio_content", {})
            [block] = audio.content
            assert block.type == "audio" and block.mime_type == "audio/wav" and base64.b64decode(block.data) == WAV

            embedded = await session.call_tool("test_embedded_resource", {})
            [block] = embedded.content
            assert block.type == "resource"
            assert str(block.resource.uri) == "test://embedded-resource"
            assert block.resource.text == "This is an embedded resource content."
            assert block.resource.mime_type == "text/plain"

            mixed = await session.call_tool("test_multiple_content_types", {})
            assert [b.type for b in mixed.content] == ["text", "image", "resource"]
            assert json.loads(mixed.content[2].resource.text) == {"test": "data", "value": 123}

            linked = await session.call_tool("media_from_path", {"name": "dot.png"})
            image_block, link = linked.content
            assert image_block.type == "image" and image_block.mime_type == "image/png"
            assert link.type == "resource_link" and link.name == "dot.png"
            assert link.uri == (env.global_tools / "dot.png").resolve().as_uri()
            assert link.mime_type == "image/png" and link.size == len(PNG)

    run(scenario)


def test_the_tiny_client_and_the_dispatcher_pass_blocks_through(kit: Daemon) -> None:
    env = kit.env
    with kit.client() as client:
        result = client.call("media_from_path", name="raw.bin")  # type from the bytes, not the name
        [image] = result.blocks("image")
        assert image["mimeType"] == "image/png" and base64.b64decode(image["data"]) == PNG
        assert result.blocks("resource_link")[0]["name"] == "raw.bin"

    with kit.raw() as raw:
        raw.request("atomic/attach", {"directory": str(env.project), "dispatcher": True})
        answer = raw.request("tools/call", {"name": "atomic_call_tool", "arguments": {"name": "test_multiple_content_types", "arguments": {}}})
        assert [b["type"] for b in answer["result"]["content"]] == ["text", "image", "resource"]


def test_a_binary_past_the_size_limit_is_spilled_whole_and_the_result_says_so(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "media.py", KIT)
    daemon = make_daemon({"ATOMICTOOLS_TRUNCATE_BYTES": "4096"})
    with daemon.client() as client:
        small = client.call("media_big", size=4000)
        assert small.blocks("image") and not small.is_error

        result = client.call("media_big", size=10_000)
        assert not result.blocks("image"), "an image past the limit is never sent, cut or whole"
        assert "10,000 bytes" in result.text and "never cut" in result.text
        spilled = Path(result.meta["atomic/fullOutput"])
        assert spilled.suffix == ".png" and spilled.read_bytes() == PNG + bytes(10_000 - len(PNG))
        assert result.meta["atomic/spilled"] == [str(spilled)]


def test_content_that_cannot_be_built_is_an_error_saying_what_to_do(kit: Daemon) -> None:
    with kit.client() as client:
        unknown = client.call("media_nameless")
        assert unknown.is_error and "pass mime_type=" in unknown.text
        missing = client.call("media_from_path", name="nope.png")
        assert missing.is_error and "nope.png" in missing.text


def test_content_values_guess_their_type_and_build_blocks_without_a_daemon(tmp_path: Path) -> None:
    assert Image(PNG).block() == {"type": "image", "data": base64.b64encode(PNG).decode(), "mimeType": "image/png"}
    svg = tmp_path / "pic"
    svg.write_bytes(b"<svg xmlns='http://www.w3.org/2000/svg'/>")
    assert Image(svg).block()["mimeType"] == "image/svg+xml"
    with pytest.raises(ValueError, match="image/\\* MIME type"):
        Image(WAV).block()
    blob = Resource(uri="x://b", data=PNG).block()["resource"]
    assert blob["mimeType"] == "image/png" and base64.b64decode(blob["blob"]) == PNG
    assert ResourceLink("https://example.com/docs/", name="Docs").block() == {
        "type": "resource_link", "uri": "https://example.com/docs/", "name": "Docs",
    }
