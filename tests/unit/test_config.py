"""Settings loading: defaults, layering of files and MOP_* variables, and one-line errors."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mop.config import DEFAULTS_FILE, ConfigError, dump_settings, load_settings, settings_document
from mop.settings import LimitsSettings, Settings

REPO_SETTINGS = Path(__file__).parents[2] / "settings.toml"
# The embedded defaults leave the Pulsar adapter out until it lands; everything else is Settings().
DEFAULTS = Settings()


@pytest.fixture(autouse=True)
def _empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # load_settings reads ./settings.toml; run each test where there is none unless it writes one.
    monkeypatch.chdir(tmp_path)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def error_for(config_file: Path | None = None, **environ: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_settings(config_file, environ=environ)
    assert "\n" not in str(info.value)
    return info.value


def test_defaults() -> None:
    assert load_settings(environ={}) == DEFAULTS


def test_every_key_is_in_the_defaults_file() -> None:
    text = DEFAULTS_FILE.read_text(encoding="utf-8")
    with DEFAULTS_FILE.open("rb") as file:
        defaults = tomllib.load(file)["default"]

    def check(section: object, table: dict[str, object]) -> None:
        for field in dataclasses.fields(section):  # type: ignore[arg-type]
            value = getattr(section, field.name)
            if dataclasses.is_dataclass(value):
                check(value, table[field.name])  # type: ignore[arg-type]
            elif value is None:  # unset keys are shown commented out
                assert f"\n# {field.name} = " in text, field.name
            else:
                assert field.name in table, field.name

    check(Settings(), defaults)


def test_repository_settings_file_matches_embedded_defaults() -> None:
    with REPO_SETTINGS.open("rb") as repo, DEFAULTS_FILE.open("rb") as embedded:
        assert tomllib.load(repo) == tomllib.load(embedded)


def test_environment_overrides() -> None:
    settings = load_settings(
        environ={
            "MOP_MODE": "separated",
            "MOP_DATA_DIR": "/var/lib/mop",
            "MOP_PROTOCOLS": '["mqtt"]',
            "MOP_MQTT__PORT": "1884",
            "MOP_MQTT__RETAIN_AVAILABLE": "false",
            "MOP_MQTT__CONNECT_TIMEOUT": "2.5",
            "MOP_MQTT__TLS__CERTFILE": "/etc/mop/server.crt",
            "MOP_MQTT__TLS__KEYFILE": "/etc/mop/server.key",
            "MOP_CLUSTER__BROKERS": '["pulsar://127.0.0.1:6650", "pulsar://127.0.0.1:6651"]',
            "MOP_STORAGE__FSYNC": "never",
            "PATH": "/usr/bin",  # not ours: ignored
        }
    )
    assert settings.mode == "separated"
    assert settings.data_dir == "/var/lib/mop"
    assert settings.protocols == ("mqtt",)
    assert settings.mqtt.port == 1884
    assert settings.mqtt.host == DEFAULTS.mqtt.host  # a nested override keeps its neighbours
    assert settings.mqtt.retain_available is False
    assert settings.mqtt.connect_timeout == 2.5
    assert settings.mqtt.tls.enabled
    assert settings.cluster.brokers == ("pulsar://127.0.0.1:6650", "pulsar://127.0.0.1:6651")
    assert settings.storage.fsync == "never"


def test_environ_defaults_to_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOP_MQTT__PORT", "1999")
    assert load_settings().mqtt.port == 1999


def test_config_file_overrides(tmp_path: Path) -> None:
    config = write(
        tmp_path / "mop.toml",
        """
        [default]
        protocols = ["mqtt", "pulsar"]
        [default.mqtt]
        port = 1885
        [default.storage]
        fsync = "interval"
        """,
    )
    settings = load_settings(config, environ={})
    assert settings.protocols == ("mqtt", "pulsar")
    assert settings.mqtt.port == 1885
    assert settings.storage.fsync == "interval"
    assert settings.mqtt.max_inflight == DEFAULTS.mqtt.max_inflight


def test_layers_merge_key_by_key_and_lists_replace(tmp_path: Path) -> None:
    write(
        tmp_path / "settings.toml",
        '[default]\nprotocols = ["mqtt", "pulsar"]\n[default.mqtt]\nhost = "0.0.0.0"\n',
    )
    config = write(tmp_path / "other.toml", '[default]\nprotocols = ["pulsar"]\n')
    settings = load_settings(config, environ={"MOP_MQTT__PORT": "0"})
    assert settings.mqtt.host == "0.0.0.0"  # from ./settings.toml
    assert settings.mqtt.port == 0  # from the environment
    assert settings.protocols == ("pulsar",)  # the later list replaces the earlier one


def test_dynaconf_none_token_unsets_a_value(tmp_path: Path) -> None:
    write(
        tmp_path / "settings.toml",
        '[default.mqtt.tls]\ncertfile = "/etc/mop/a.crt"\nkeyfile = "/etc/mop/a.key"\n',
    )
    assert load_settings(environ={}).mqtt.tls.enabled
    config = write(tmp_path / "plain.toml", '[default.mqtt.tls]\ncertfile = "@none"\n')
    environ = {"MOP_MQTT__TLS__KEYFILE": "@none"}
    assert not load_settings(config, environ=environ).mqtt.tls.enabled


def test_environment_beats_config_file(tmp_path: Path) -> None:
    config = write(tmp_path / "mop.toml", "[default.mqtt]\nport = 1885\n")
    assert load_settings(config, environ={"MOP_MQTT__PORT": "1886"}).mqtt.port == 1886


def test_dump_loads_back(tmp_path: Path) -> None:
    settings = load_settings(
        environ={
            "MOP_MQTT__TLS__CERTFILE": 'C:\\certs\\a "b".crt',
            "MOP_MQTT__TLS__KEYFILE": "/k",
            "MOP_CLUSTER__BROKERS": '["pulsar://a:1"]',
            "MOP_PULSAR__PARTITIONED_TOPICS": '{ orders = 4, "persistent://public/x/a b" = 2 }',
            "MOP_PULSAR__ADVERTISED_LISTENERS": '{ ext = "pulsar://h:1,pulsar+ssl://h:2" }',
        }
    )
    assert settings.pulsar.partitioned_topics == {"orders": 4, "persistent://public/x/a b": 2}
    assert settings.pulsar.advertised_listeners == {"ext": "pulsar://h:1,pulsar+ssl://h:2"}
    config = write(tmp_path / "dumped.toml", dump_settings(settings))
    assert load_settings(config, environ={}) == settings
    # Frozen all the way: the tables are read-only and the settings stay hashable.
    assert hash(settings) == hash(load_settings(config, environ={}))
    assert hash(Settings()) == hash(Settings())
    with pytest.raises(TypeError):
        settings.pulsar.partitioned_topics["orders"] = 1  # type: ignore[index]
    document = settings_document(settings)
    assert document["pulsar"]["partitioned_topics"] == {"orders": 4, "persistent://public/x/a b": 2}
    assert document["cluster"]["brokers"] == ["pulsar://a:1"]


@pytest.mark.parametrize(
    ("environ", "key", "problem"),
    [
        ({"MOP_MQTT__PORT": "abc"}, "mqtt.port", "must be an integer between 0 and 65535"),
        ({"MOP_MQTT__PORT": "65536"}, "mqtt.port", "between 0 and 65535 (got 65536)"),
        ({"MOP_PULSAR__PORT": "-1"}, "pulsar.port", "between 0 and 65535"),
        ({"MOP_ADMIN__PORT": "true"}, "admin.port", "between 0 and 65535 (got True)"),
        ({"MOP_MODE": "both"}, "mode", "must be one of 'merged', 'separated' (got 'both')"),
        ({"MOP_STORAGE__FSYNC": "sometimes"}, "storage.fsync", "'always', 'interval', 'never'"),
        ({"MOP_LIMITS__MAX_CONNECTIONS": "0"}, "limits.max_connections", "positive integer"),
        ({"MOP_MQTT__MAX_INFLIGHT": "70000"}, "mqtt.max_inflight", "between 1 and 65535"),
        ({"MOP_STORAGE__RETENTION_BYTES": "5"}, "storage.retention_bytes", "retention.size_bytes"),
        ({"MOP_STORAGE__RETENTION_SECONDS": "5"}, "storage.retention_seconds", "time_seconds"),
        ({"MOP_RETENTION__SIZE_BYTES": "-2"}, "retention.size_bytes", ">= -1"),
        (
            {"MOP_RETENTION__NAMESPACES": '[{namespace="public"}]'},
            "retention.namespaces.namespace",
            "tenant/namespace",
        ),
        (
            {"MOP_RETENTION__NAMESPACES": "[{time_seconds=5}]"},
            "retention.namespaces",
            "needs namespace",
        ),
        (
            {"MOP_RETENTION__NAMESPACES": '[{namespace="a/b", time=5}]'},
            "retention.namespaces.time",
            "unknown key",
        ),
        ({"MOP_MQTT__CONNECT_TIMEOUT": "0"}, "mqtt.connect_timeout", "positive number"),
        ({"MOP_MQTT__WS_ENABLED": "yes"}, "mqtt.ws_enabled", "must be true or false"),
        ({"MOP_DATA_DIR": "1"}, "data_dir", "must be a string (got 1)"),
        ({"MOP_LOG_LEVEL": "LOUD"}, "log_level", "must be one of 'DEBUG'"),
        ({"MOP_LOG_FORMAT": "xml"}, "log_format", "must be one of 'text', 'json' (got 'xml')"),
        ({"MOP_MQTT__SYS_EVENTS": "1"}, "mqtt.sys_events", "must be true or false"),
        ({"MOP_MQTT__SYS_NODE_NAME": "a/b"}, "mqtt.sys_node_name", "one topic level"),
        ({"MOP_MQTT__SYS_NODE_NAME": '""'}, "mqtt.sys_node_name", "not empty"),
        ({"MOP_PROTOCOLS": "mqtt"}, "protocols", "must be a list (got 'mqtt')"),
        ({"MOP_PROTOCOLS": '[""]'}, "protocols", "protocol names"),
        ({"MOP_CLUSTER__BROKERS": '["http://a:1"]'}, "cluster.brokers", "pulsar:// URLs"),
        ({"MOP_CLUSTER__SERVICE_URL": "a:1"}, "cluster.service_url", "pulsar:// URL"),
        ({"MOP_CLUSTER__ADMIN_URL": "b1:8080"}, "cluster.admin_url", "http:// or https:// URLs"),
        ({"MOP_CLUSTER__ADMIN_URL": "http://b1:1,pulsar://b2:2"}, "cluster.admin_url", "http://"),
        ({"MOP_MQTT": "5"}, "mqtt", "must be a table (got 5)"),
        ({"MOP_PULSAR__SCHEMA_MAX_BYTES": "0"}, "pulsar.schema_max_bytes", "between 1 and"),
        ({"MOP_PULSAR__PARTITIONED_TOPICS": "[1]"}, "pulsar.partitioned_topics", "a table"),
        ({"MOP_PULSAR__PARTITIONED_TOPICS": "{ a = 0 }"}, "pulsar.partitioned_topics", "1 and"),
        ({"MOP_PULSAR__PARTITIONED_TOPICS": '{ a = "2" }'}, "pulsar.partitioned_topics", "integer"),
        ({"MOP_PULSAR__PARTITIONED_TOPICS": '{ " " = 2 }'}, "pulsar.partitioned_topics", "names"),
        (
            {"MOP_PULSAR__ADVERTISED_LISTENERS": '{ ext = "http://h:1" }'},
            "pulsar.advertised_listeners",
            "pulsar:// URL, a pulsar+ssl:// URL or one of each",
        ),
        ({"MOP_MQTT__TLS__CERTFILE": "/c"}, "mqtt.tls", "certfile and keyfile must be set"),
        ({"MOP_MQTT__TLS__KEYFILE": "/k"}, "mqtt.tls", "certfile and keyfile must be set"),
        ({"MOP_LIMITS__CONNECTION_RATE": "-1"}, "limits.connection_rate", "positive number"),
        ({"MOP_LIMITS__CLIENT_BYTE_BURST": "-1"}, "limits.client_byte_burst", ">= 0"),
        ({"MOP_LIMITS__MEMORY_CHECK_INTERVAL": "0"}, "limits.memory_check_interval", "positive"),
        ({"MOP_LIMITS__SUBSCRIBER_BACKLOG_BYTES": "-1"}, "limits.subscriber_backlog_bytes", ">= 0"),
        (
            {"MOP_LIMITS__SUBSCRIBER_STALL_TIMEOUT": "0"},
            "limits.subscriber_stall_timeout",
            "positive",
        ),
        (
            {"MOP_LIMITS__MEMORY_HIGH_WATERMARK": "0.8", "MOP_LIMITS__MEMORY_LOW_WATERMARK": "0.9"},
            "limits",
            "memory_low_watermark must be below memory_high_watermark",
        ),
        (
            {"MOP_LIMITS__MEMORY_HIGH_WATERMARK": "0.8", "MOP_LIMITS__MEMORY_LOW_WATERMARK": "1e9"},
            "limits",
            "in the same unit",
        ),
        ({"MOP_LIMITS__MEMORY_LOW_WATERMARK": "0.5"}, "limits", "below memory_high_watermark"),
        ({"MOP_ADMIN__ALLOWED_HOSTS": '["localhost:8080"]'}, "admin.allowed_hosts", "port"),
        ({"MOP_ADMIN__ALLOWED_HOSTS": '[""]'}, "admin.allowed_hosts", "host names"),
        ({"MOP_ADMIN__ALLOWED_HOSTS": '["a b"]'}, "admin.allowed_hosts", "host names"),
        ({"MOP_ADMIN__ALLOWED_HOSTS": '["[::1]:80"]'}, "admin.allowed_hosts", "host names"),
        ({"MOP_GRPC__PORT": "70000"}, "grpc.port", "between 0 and 65535"),
        ({"MOP_GRPC__MAX_MESSAGE_BYTES": "0"}, "grpc.max_message_bytes", "between 1 and"),
        ({"MOP_GRPC__MAX_MESSAGE_BYTES": "2147483648"}, "grpc.max_message_bytes", "1073741824"),
        ({"MOP_GRPC__MAX_CONCURRENT_STREAMS": "0"}, "grpc.max_concurrent_streams", "between 1"),
        ({"MOP_GRPC__KEEPALIVE_INTERVAL": "-1"}, "grpc.keepalive_interval", "number"),
        ({"MOP_GRPC__KEEPALIVE_TIMEOUT": "0"}, "grpc.keepalive_timeout", "positive number"),
        ({"MOP_GRPC__TLS__CERTFILE": "/c"}, "grpc.tls", "certfile and keyfile must be set"),
    ],
)
def test_invalid_values(environ: dict[str, str], key: str, problem: str) -> None:
    error = error_for(**environ)
    assert error.key == key
    assert problem in error.problem
    assert str(error) == f"{key}: {error.problem}"


def test_grpc_keepalive_may_be_off() -> None:
    settings = load_settings(environ={"MOP_GRPC__KEEPALIVE_INTERVAL": "0"})
    assert settings.grpc.keepalive_interval == 0
    assert settings.grpc.max_message_bytes == 5 * 1024 * 1024


def test_admin_url_takes_one_url_or_several() -> None:
    for value in ("http://b1:8080", "https://b1:8443,b2:8443", "http://b1:1,http://b2:2"):
        assert load_settings(environ={"MOP_CLUSTER__ADMIN_URL": value}).cluster.admin_url == value


def test_allowed_hosts_take_names_addresses_and_any() -> None:
    hosts = '["mop.example", "10.0.0.7", "::1", "[fe80::1]", "*"]'
    settings = load_settings(environ={"MOP_ADMIN__ALLOWED_HOSTS": hosts})
    assert settings.admin.allowed_hosts == ("mop.example", "10.0.0.7", "::1", "[fe80::1]", "*")
    assert load_settings(environ={}).admin.allowed_hosts == ()


def test_message_format() -> None:
    error = error_for(MOP_MQTT__PORT="abc")
    assert str(error) == "mqtt.port: must be an integer between 0 and 65535 (got 'abc')"


def test_unknown_key_from_environment() -> None:
    error = error_for(MOP_MQTT__PROT="1884")
    assert error.key == "mqtt.prot"
    assert error.problem == "unknown key (from environment variable MOP_MQTT__PROT)"


def test_unknown_key_from_file(tmp_path: Path) -> None:
    config = write(tmp_path / "mop.toml", "[default.storage]\nfsinc = 'never'\n")
    error = error_for(config)
    assert error.key == "storage.fsinc"
    assert error.problem.startswith("unknown key")
    assert str(config) in error.problem


def test_unknown_top_level_key(tmp_path: Path) -> None:
    error = error_for(MOP_COLOUR="blue")
    assert (error.key, error.problem.split(" (")[0]) == ("colour", "unknown key")


@pytest.mark.parametrize("text", ["[mqtt]\nport = 1\n", "mode = 'merged'\n", "[defualt]\n"])
def test_settings_outside_the_default_table(tmp_path: Path, text: str) -> None:
    config = write(tmp_path / "mop.toml", text)
    error = error_for(config)
    assert error.key == str(config)
    assert "[default]" in error.problem


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    error = error_for(missing)
    assert error.key == str(missing)
    assert error.problem == "settings file not found"


def test_invalid_toml(tmp_path: Path) -> None:
    config = write(tmp_path / "mop.toml", "[default\n")
    error = error_for(config)
    assert error.key == str(config)
    assert error.problem.startswith("cannot read settings file")


def test_invalid_value_in_local_settings_file(tmp_path: Path) -> None:
    write(tmp_path / "settings.toml", "[default.mqtt]\nport = 'abc'\n")
    assert error_for().key == "mqtt.port"


@given(port=st.integers(min_value=-(2**70), max_value=2**70))
def test_port_range(port: int) -> None:
    environ = {"MOP_MQTT__PORT": str(port)}
    if 0 <= port <= 65535:
        assert load_settings(environ=environ).mqtt.port == port
    else:
        with pytest.raises(ConfigError, match=r"^mqtt\.port: "):
            load_settings(environ=environ)


def test_log_format_and_sys_events() -> None:
    settings = load_settings(
        environ={
            "MOP_LOG_FORMAT": "json",
            "MOP_MQTT__SYS_EVENTS": "true",
            "MOP_MQTT__SYS_NODE_NAME": "mop@edge-1",
        }
    )
    assert settings.log_format == "json"
    assert settings.mqtt.sys_events is True
    assert settings.mqtt.sys_node_name == "mop@edge-1"


def test_sys_interval_zero_turns_sys_off() -> None:
    settings = load_settings(environ={"MOP_MQTT__SYS_INTERVAL": "0"})
    assert settings.mqtt.sys_interval == 0
    with pytest.raises(ConfigError, match=r"mqtt\.connect_timeout"):
        load_settings(environ={"MOP_MQTT__CONNECT_TIMEOUT": "0"})


def test_a_moved_key_still_works_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = write(tmp_path / "old.toml", "[default.mqtt]\nmax_connections = 7\nport = 1884\n")
    with caplog.at_level("WARNING", logger="mop.config"):
        settings = load_settings(config, environ={"MOP_MQTT__MAX_CONNECTIONS": "9"})
    assert settings.limits.max_connections == 9  # the environment still beats the file
    assert settings.mqtt.port == 1884
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    moved = "mqtt.max_connections is deprecated; use limits.max_connections"
    assert all(moved in warning for warning in warnings)


def test_the_new_key_wins_over_the_moved_one_in_the_same_file(tmp_path: Path) -> None:
    text = "[default.mqtt]\nmax_connections = 7\n[default.limits]\nmax_connections = 5\n"
    settings = load_settings(write(tmp_path / "both.toml", text), environ={})
    assert settings.limits.max_connections == 5


def test_a_moved_key_reports_errors_under_its_new_name() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"MOP_MQTT__MAX_CONNECTIONS": "0"})
    assert caught.value.key == "limits.max_connections"


def test_overload_limits_are_off_by_default_and_take_rates_and_marks() -> None:
    assert load_settings(environ={}).limits == LimitsSettings()
    limits = load_settings(
        environ={
            "MOP_LIMITS__CONNECTION_RATE": "50",
            "MOP_LIMITS__CLIENT_MESSAGE_RATE": "1000.5",
            "MOP_LIMITS__CLIENT_BYTE_RATE": "1048576",
            "MOP_LIMITS__MEMORY_HIGH_WATERMARK": "2147483648",
            "MOP_LIMITS__MEMORY_LOW_WATERMARK": "1073741824",
        }
    ).limits
    assert limits.connection_rate == 50.0 and limits.connection_burst == 0
    assert limits.client_message_rate == 1000.5 and limits.client_byte_rate == 1048576.0
    assert (limits.memory_high_watermark, limits.memory_low_watermark) == (2**31, 2**30)


def test_retention_of_single_namespaces(tmp_path: Path) -> None:
    config = write(
        tmp_path / "mop.toml",
        "[default.retention]\ntime_seconds = -1\n"
        '[[default.retention.namespaces]]\nnamespace = "public/telemetry"\n'
        "time_seconds = 604800\nsize_bytes = 0\n",
    )
    settings = load_settings(config, environ={})
    assert settings.retention.time_seconds == -1
    (entry,) = settings.retention.namespaces
    assert (entry.namespace, entry.time_seconds, entry.size_bytes) == (
        "public/telemetry",
        604800,
        0,
    )
    # What dump_settings writes loads back to the same settings.
    again = write(tmp_path / "dumped.toml", dump_settings(settings))
    assert load_settings(again, environ={}) == settings
