"""Configuration: defaults, config.toml, ATOMICTOOLS_* variables, and clear errors (config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from atomictoolsd.config.settings import Config, ConfigError, load_config


def test_defaults_without_file_or_environment(tmp_path: Path) -> None:
    config = load_config(tmp_path / "config.toml", {})
    assert config == Config()
    assert config.call_timeout == 60.0 and config.max_message_bytes == 16 * 1024 * 1024
    assert all(item["source"] == "default" for item in config.describe())


def test_environment_overrides_file_overrides_default(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("call_timeout = 5\npage_size = 10\nbuiltins = false\n")
    config = load_config(path, {"ATOMICTOOLS_CALL_TIMEOUT": "7.5"})
    assert (config.call_timeout, config.page_size, config.builtins) == (7.5, 10, False)
    sources = {item["key"]: item["source"] for item in config.describe()}
    assert sources["call_timeout"] == "ATOMICTOOLS_CALL_TIMEOUT"
    assert sources["page_size"] == str(path)
    assert sources["truncate_lines"] == "default"


def test_the_sandboxs_settings_come_from_the_file_only(tmp_path: Path) -> None:
    # An agent started on a repository's word sets the daemon's environment, never the user's file.
    widening = {"ATOMICTOOLS_SANDBOX_ALLOW_NET": "1", "ATOMICTOOLS_SANDBOX_ALLOW_WRITE": "/", "ATOMICTOOLS_SANDBOX_ABI": "0",
                "ATOMICTOOLS_SANDBOX_ALLOW_ENV": "GITHUB_TOKEN", "ATOMICTOOLS_SANDBOX_GLOBAL": "0"}
    path = tmp_path / "config.toml"
    path.write_text('sandbox_global = true\nsandbox_protect = ".foo"\n')
    config = load_config(path, widening)
    assert (config.sandbox_allow_net, config.sandbox_allow_write, config.sandbox_abi) == (False, "", -1)
    assert (config.sandbox_allow_env, config.sandbox_global, config.sandbox_protect) == ("", True, ".foo")
    described = {item["key"]: item for item in config.describe()}
    assert described["sandbox_global"]["source"] == str(path) and described["sandbox_allow_net"]["source"] == "default"
    assert all(described[key]["env"] is None for key in described if key.startswith("sandbox_"))


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("call_timeout = 'soon'\n", {}, r"call_timeout \(from .*config.toml\): expected a number, got 'soon'"),
        ("", {"ATOMICTOOLS_PAGE_SIZE": "0"}, r"page_size \(from ATOMICTOOLS_PAGE_SIZE\): must be at least 1"),
        ("", {"ATOMICTOOLS_BUILTINS": "maybe"}, "expected true or false"),
        ("", {"ATOMICTOOLS_LOG_LEVEL": "loud"}, "must be one of debug, info, warning, error"),
        ("calltimeout = 3\n", {}, "unknown setting 'calltimeout'"),
        ("call_timeout = \n", {}, "is not valid TOML"),
        ("page_size = 2.5\n", {}, "expected an integer"),
    ],
)
def test_bad_values_name_the_key_and_where_it_came_from(tmp_path: Path, text: str, env: dict[str, str], message: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path, env)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="finite"):
        load_config(tmp_path / "config.toml", {"ATOMICTOOLS_CALL_TIMEOUT": value})


def test_a_file_only_setting_is_never_read_from_the_environment(tmp_path: Path) -> None:
    """trust_all widens what a project's code may do: an agent's config entry can set the environment,
    so the variable is ignored, and named with the line that sets it where it counts."""
    path = tmp_path / "config.toml"
    config = load_config(path, {"ATOMICTOOLS_TRUST_ALL": "1"})
    assert config.trust_all is False and "trust_all" not in config.sources
    assert list(config.ignored) == ["ATOMICTOOLS_TRUST_ALL"]
    assert f"put `trust_all = true` in {path}" in config.ignored["ATOMICTOOLS_TRUST_ALL"]
    assert next(i for i in config.describe() if i["key"] == "trust_all")["env"] is None
    path.write_text("trust_all = true\n")
    config = load_config(path, {"ATOMICTOOLS_TRUST_ALL": "0"})
    assert config.trust_all is True and config.sources["trust_all"] == str(path)
