"""Settings validation: bad input fails at task registration, naming the option."""

from __future__ import annotations

import itertools
import logging
import math
import re
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery import Celery

from celery_lease import LeaseConfigError, LeasedTask
from celery_lease.settings.config import (
    MIN_STORE_TIMEOUT,
    MIN_TTL,
    beat_settings,
    resolve_backend,
    resolve_options,
    resolve_signal,
)


def make_app(**conf: object) -> Celery:
    app = Celery("cfg", broker="memory://", set_as_current=False)
    app.conf.update({"lease_backend": "redis://127.0.0.1:1/0", **conf})
    app.finalize()
    return app


def register(app: Celery, **options: object) -> LeasedTask:
    @app.task(base=LeasedTask, shared=False, **options)  # type: ignore[misc]
    def job(a: int, b: int = 2) -> int:
        return a + b

    return job  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lease_ttl", 0),
        ("lease_ttl", -1.0),
        ("lease_ttl", math.nan),
        ("lease_ttl", math.inf),
        ("lease_ttl", "30"),
        ("lease_ttl", True),
        ("lease_ttl", 0.0001),
        ("lease_renew_interval", 0),
        ("lease_renew_interval", math.nan),
        ("lease_cooldown", 0),
        ("lease_cooldown", "60"),
        ("lease_preempt_grace", -1.0),
        ("lease_preempt_grace", math.nan),
    ],
)
def test_invalid_durations_fail_at_registration(option: str, value: object) -> None:
    with pytest.raises(LeaseConfigError, match=option):
        register(make_app(), **{option: value})


def test_interval_above_half_ttl_is_refused_with_the_fix() -> None:
    with pytest.raises(LeaseConfigError, match=r"lease_renew_interval=6.0.*above half") as info:
        register(make_app(), lease_ttl=10.0, lease_renew_interval=6.0)
    assert "lease_ttl / 3" in str(info.value)


def test_interval_above_a_third_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="celery_lease"):
        register(make_app(), lease_ttl=10.0, lease_renew_interval=4.0)
    assert "above a third of lease_ttl" in caplog.text


def test_store_timeout_not_shorter_than_interval_is_refused() -> None:
    with pytest.raises(LeaseConfigError, match=r"lease_store_timeout=3.0.*shorter than"):
        register(make_app(), lease_ttl=9.0, lease_store_timeout=3.0)


def test_app_setting_is_validated_too() -> None:
    with pytest.raises(LeaseConfigError, match="lease_ttl=-5"):
        register(make_app(lease_ttl=-5))


def test_fractional_seconds_are_exact() -> None:
    options = resolve_options({}, {"lease_ttl": 1.9}, "t")
    assert options.ttl_ms == 1900
    assert resolve_options({}, {"lease_ttl": 0.3006}, "t").ttl_ms == 301
    assert options.renew_interval == pytest.approx(1.9 / 3)
    assert options.store_timeout == pytest.approx(1.9 / 6)


def test_defaults() -> None:
    options = resolve_options({}, {}, "t")
    assert (options.ttl, options.renew_interval, options.store_timeout) == (30.0, 10.0, 2.0)
    assert (options.on_conflict, options.on_store_error, options.key_prefix) == (
        "skip",
        "retry",
        "lease",
    )


def test_task_option_overrides_app_setting() -> None:
    task = register(make_app(lease_ttl=60.0), lease_ttl=6.0)
    options, _, _ = task.lease_settings()
    assert options.ttl == 6.0
    assert options.renew_interval == 2.0


def test_unknown_on_conflict_fails_at_registration() -> None:
    with pytest.raises(LeaseConfigError, match=r"lease_on_conflict='wait'.*'skip'"):
        register(make_app(), lease_on_conflict="wait")


def test_cooldown_after_other_than_success_or_any_fails_at_registration() -> None:
    with pytest.raises(LeaseConfigError, match=r"lease_cooldown_after='failure'.*'success'"):
        register(make_app(), lease_cooldown=60.0, lease_cooldown_after="failure")


def test_a_zero_preempt_grace_and_a_cooldown_resolve_to_their_values() -> None:
    options = resolve_options({}, {"lease_cooldown": 90, "lease_preempt_grace": 0}, "t")
    assert (options.cooldown, options.cooldown_after, options.preempt_grace) == (
        90.0,
        "success",
        0.0,
    )


def test_lease_key_naming_a_missing_parameter_fails_at_registration() -> None:
    with pytest.raises(LeaseConfigError, match=r"names 'c'.*not a parameter"):
        register(make_app(), lease_key=("c",))


def test_lease_key_given_as_a_bare_string_fails_with_the_fix() -> None:
    with pytest.raises(LeaseConfigError, match=r"lease_key=\('a',\)"):
        register(make_app(), lease_key="a")


def test_prefix_with_braces_is_refused() -> None:
    with pytest.raises(LeaseConfigError, match="hash tag"):
        register(make_app(), lease_key_prefix="a{b}")


def test_backend_falls_back_to_redis_broker_and_names_the_setting_otherwise() -> None:
    options = resolve_options({}, {}, "t")
    assert resolve_backend(options, {"broker_url": "redis://h:1/0"}, "t") == "redis://h:1/0"
    with pytest.raises(LeaseConfigError, match="lease_backend is not set"):
        resolve_backend(options, {"broker_url": "amqp://guest@localhost//"}, "t")


def test_signal_validation() -> None:
    import signal

    assert resolve_signal("SIGUSR2") == signal.SIGUSR2
    with pytest.raises(LeaseConfigError, match="billiard"):
        resolve_signal("SIGUSR1")
    with pytest.raises(LeaseConfigError, match="not a signal"):
        resolve_signal("SIGNOPE")


def test_unknown_lease_options_and_settings_are_refused_with_a_suggestion() -> None:
    with pytest.raises(LeaseConfigError, match=r"unknown task option lease_tll.*lease_ttl"):
        register(make_app(), lease_tll=5.0)
    with pytest.raises(LeaseConfigError, match="unknown setting lease_on_confict"):
        register(make_app(lease_on_confict="fail"))


def test_process_wide_settings_are_checked_at_registration() -> None:
    with pytest.raises(LeaseConfigError, match="lease_signal='SIGFOO'"):
        register(make_app(lease_signal="SIGFOO"))
    with pytest.raises(LeaseConfigError, match="lease_require_noeviction='false'"):
        register(make_app(lease_require_noeviction="false"))


@pytest.mark.parametrize("value", [1e17, 10**400])
def test_absurd_lifetimes_are_refused(value: float) -> None:
    with pytest.raises(LeaseConfigError, match="at most a year"):
        register(make_app(), lease_ttl=value)


def test_malformed_backend_url_is_refused_naming_lease_backend() -> None:
    with pytest.raises(LeaseConfigError, match="lease_backend="):
        register(make_app(), lease_backend="redis://localhost:63 79/1")


def test_a_subclass_of_a_leased_task_uses_its_own_settings_after_its_parent_ran() -> None:
    app = make_app(lease_ttl=30.0)

    class Parent(LeasedTask):  # type: ignore[misc]
        name = "cfg.parent"
        lease_ttl = 9.0

        def run(self, a: int) -> int:
            return a

    parent = app.register_task(Parent())
    assert parent.lease_settings().options.ttl == 9.0  # resolved and cached for Parent

    class Child(Parent):
        name = "cfg.child"
        lease_ttl = 3.0
        lease_key_prefix = "child"

    child = app.register_task(Child())
    options, _, _ = child.lease_settings()
    assert (options.ttl, options.key_prefix) == (3.0, "child")
    assert parent.lease_settings().options.ttl == 9.0


def test_lease_settings_is_one_named_object_that_still_unpacks() -> None:
    settings = register(make_app(lease_signal="SIGUSR2")).lease_settings()
    assert settings.url == "redis://127.0.0.1:1/0"
    assert settings.signum == signal.SIGUSR2
    options, url, signum = settings
    assert (options, url, signum) == (settings.options, settings.url, settings.signum)


@pytest.mark.parametrize(
    ("conf", "named"),
    [
        ({"lease_beat_ttl": "30s"}, "lease_beat_ttl"),
        ({"lease_beat_ttl": 0}, "lease_beat_ttl"),
        ({"lease_beat_ttl": 30.0, "lease_beat_renew_interval": 20.0}, "lease_beat_renew_interval"),
        ({"lease_beat_renew_interval": math.nan}, "lease_beat_renew_interval"),
    ],
)
def test_beat_settings_are_validated_like_tasks_and_name_the_beat_setting(
    conf: dict[str, object],
    named: str,
) -> None:
    with pytest.raises(LeaseConfigError, match=named):
        beat_settings(make_app(**conf).conf)


def test_beat_interval_defaults_to_a_third_of_the_beat_ttl_not_the_task_interval() -> None:
    settings = beat_settings(make_app(lease_renew_interval=5.0, lease_beat_ttl=3.0).conf)
    assert (settings.options.ttl, settings.options.renew_interval) == (3.0, 1.0)
    assert settings.url == "redis://127.0.0.1:1/0"


def test_a_ttl_too_short_for_a_working_store_timeout_is_refused_with_the_smallest_that_works() -> (
    None
):
    with pytest.raises(
        LeaseConfigError, match=r"lease_ttl=0.1 .* of 17 ms, below the 50 ms"
    ) as info:
        register(make_app(), lease_ttl=0.1)
    assert f"smallest lease_ttl that works is {MIN_TTL}" in str(info.value)
    with pytest.raises(LeaseConfigError, match=r"lease_store_timeout=0.01 .* is 10 ms"):
        register(make_app(), lease_ttl=1.0, lease_store_timeout=0.01)
    with pytest.raises(LeaseConfigError, match=r"lease_beat_ttl=0.2 .*below the 50 ms"):
        beat_settings({"lease_backend": "redis://h/0", "lease_beat_ttl": 0.2})
    assert resolve_options({}, {"lease_ttl": MIN_TTL}, "t").store_timeout == pytest.approx(
        MIN_STORE_TIMEOUT
    )


def test_every_unknown_setting_is_reported_in_one_error() -> None:
    with pytest.raises(LeaseConfigError) as info:
        register(make_app(lease_tll=5.0, lease_on_confict="fail", lease_frobnicate=1))
    message = str(info.value)
    assert message.startswith("3 unknown settings (app.conf)")
    for name, hint in (("lease_tll", "lease_ttl"), ("lease_on_confict", "lease_on_conflict")):
        assert f"{name}, did you mean {hint}?" in message
    assert "lease_frobnicate" in message
    with pytest.raises(LeaseConfigError, match=r"2 unknown task options.*lease_tl, .*lease_tll, "):
        register(make_app(), lease_tll=5.0, lease_tl=1.0)
    with pytest.raises(LeaseConfigError) as both:  # options and settings in the same error
        register(make_app(lease_on_confict="fail"), lease_tll=5.0)
    assert str(both.value) == (
        "unknown task option lease_tll (task tests.test_config.job); did you mean lease_ttl?\n"
        "unknown setting lease_on_confict (app.conf); did you mean lease_on_conflict?"
    )


DJANGO_SETTINGS = """\
# A Django settings module, as a Django project writes it (read without Django).
DEBUG = False
TIME_ZONE = "UTC"
INSTALLED_APPS = ["accounts"]
CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
CELERY_LEASE_BACKEND = "redis://127.0.0.1:1/1"
CELERY_LEASE_ON_CONFLICT = "retry"
"""


@pytest.fixture
def django_settings(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[str], str]]:
    """Write a settings module with ``extra`` lines; return its importable name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written = []

    def write(extra: str) -> str:
        name = f"django_style_settings_{len(written)}"
        (tmp_path / f"{name}.py").write_text(DJANGO_SETTINGS + extra)
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def django_app(module: str, namespace: str = "CELERY") -> Celery:
    app = Celery("proj", set_as_current=False)
    app.config_from_object(module, namespace=namespace)
    app.finalize()  # what a worker does before it runs: the tasks are registered
    return app


def test_namespaced_settings_take_effect_and_a_misspelt_one_is_refused_like_a_plain_one(
    django_settings: Callable[[str], str],
) -> None:
    app = django_app(django_settings("CELERY_LEASE_TTL = 12.0\n"))
    job = register(app)
    options, url, _ = job.lease_settings()
    assert (options.ttl, options.on_conflict, url) == (12.0, "retry", "redis://127.0.0.1:1/1")

    with pytest.raises(LeaseConfigError) as plain:
        register(make_app(lease_tll=5.0))
    with pytest.raises(LeaseConfigError) as namespaced:
        register(django_app(django_settings("CELERY_LEASE_TLL = 5.0\n")))
    assert "did you mean lease_ttl?" in str(plain.value)
    assert str(namespaced.value) == (
        "unknown setting CELERY_LEASE_TLL (lease_tll) (app.conf); did you mean "
        "CELERY_LEASE_TTL (lease_ttl)?"
    )


def test_every_misspelt_namespaced_setting_is_reported_in_any_namespace_case(
    django_settings: Callable[[str], str],
) -> None:
    with pytest.raises(LeaseConfigError, match=r"^2 unknown settings") as info:
        register(
            django_app(
                django_settings("CELERY_LEASE_TLL = 5.0\nCELERY_LEASE_RENEW_INTERVALL = 1.0\n")
            )
        )
    assert "did you mean CELERY_LEASE_RENEW_INTERVAL (lease_renew_interval)?" in str(info.value)
    with pytest.raises(LeaseConfigError, match=r"celery_lease_tll \(lease_tll\)"):
        register(django_app(django_settings("celery_lease_tll = 5.0\n"), namespace="celery"))
    # Outside the namespace Celery does not read a name at all: not ours to judge.
    register(django_app(django_settings("LEASE_TLL = 5.0\n")))


def test_an_upper_case_setting_without_a_namespace_is_refused_not_ignored(
    django_settings: Callable[[str], str],
) -> None:
    # Without namespace= Celery reads lease_ttl only: LEASE_TTL would leave the TTL at 30 s.
    with pytest.raises(LeaseConfigError) as info:
        register(django_app(django_settings("LEASE_TTL = 5.0\n"), namespace=""))
    assert str(info.value) == (
        "unknown setting LEASE_TTL (app.conf); did you mean lease_ttl? (without "
        "config_from_object(..., namespace=...) setting names are lower case)"
    )
    with pytest.raises(LeaseConfigError, match=r"^unknown setting Lease_Tll .*lease_ttl\?"):
        register(make_app(Lease_Tll=5.0))


@pytest.mark.parametrize(
    ("conf", "options"),
    [
        ({"broker_url": "amqp://user:s3cr3t@host:5672//", "lease_backend": None}, {}),
        (
            {
                "broker_url": "redis://user:s3cr3t@host:6379/0?socket_timeout=abc",
                "lease_backend": None,
            },
            {},
        ),
        ({}, {"lease_backend": "redis://:s3cr3t@host:12x/0"}),
        ({}, {"lease_backend": "redis://u:s3cr3t@host/0?password=s3cr3t&frob=1"}),
        (
            {},
            {
                "lease_backend": "sentinel://:s3cr3t@a:26379;sentinel://:s3cr3t@b:26379",
                "lease_backend_options": {"frob": 1},
            },
        ),
        (
            {},
            {
                "lease_backend": "rediss://h/0",
                "lease_backend_options": [("ssl_password", "s3cr3t")],
            },
        ),
    ],
)
def test_no_configuration_error_shows_a_credential(
    conf: dict[str, object], options: dict[str, object]
) -> None:
    app = make_app(**conf)
    with pytest.raises(LeaseConfigError) as info:
        register(app, **options).lease_settings()
    assert "s3cr3t" not in str(info.value)
    assert "lease_backend" in str(info.value)  # and it still names what to fix


def _apply_fix(message: str, options: dict[str, object]) -> dict[str, object]:
    """``options`` with the ``Fix: a=1.0 and leave b unset`` an error message suggests."""
    found = re.search(r"\. Fix: (.*?)(?:;|$)", message)
    assert found, message
    fixed = dict(options)
    for change in found.group(1).split(" and "):
        unset = re.fullmatch(r"leave (\w+) unset", change)
        if unset:
            fixed.pop(unset.group(1), None)
        else:
            name, value = change.split("=")
            fixed[name] = float(value)
    return fixed


BAD_TTLS = [0.1, 0.2, 0.3, 1.0, 10.0, "x", -1.0]
BAD_INTERVALS = [None, 0.01, 0.09, 0.2, 3.0, 20.0, "y"]
BAD_TIMEOUTS = [None, 0.01, 0.06, 1.0, 5.0, math.nan]


def test_the_suggested_fix_of_any_invalid_timing_passes_every_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = 0
    for ttl, interval, timeout in itertools.product(BAD_TTLS, BAD_INTERVALS, BAD_TIMEOUTS):
        given = {
            name: value
            for name, value in (
                ("lease_ttl", ttl),
                ("lease_renew_interval", interval),
                ("lease_store_timeout", timeout),
            )
            if value is not None
        }
        try:
            resolve_options({}, given, "t")
            continue
        except LeaseConfigError as exc:
            message = str(exc)
        refused += 1
        fixed = _apply_fix(message, given)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="celery_lease"):
            resolve_options({}, fixed, "t")  # raises if the fix leads to a second error
        # The only warning left is about the interval as given (above a third), and its
        # suggestion passes too.
        for record in caplog.records:
            assert (
                f"lease_renew_interval={interval!r} (t) is above a third" in record.getMessage()
            ), f"{given} -> {fixed}: {caplog.text}"
            suggested = re.search(r"consider (lease_renew_interval=\S+)$", record.getMessage())
            if suggested:
                resolve_options({}, _apply_fix(f". Fix: {suggested.group(1)}", fixed), "t")
    assert refused > 100  # the grid is mostly bad input


def test_the_reported_chain_gets_one_fix_that_works() -> None:
    # Suggesting a third of the TTL for the interval would hit the 50 ms floor next.
    with pytest.raises(LeaseConfigError) as info:
        resolve_options({}, {"lease_ttl": 0.1, "lease_renew_interval": 20.0}, "t")
    assert str(info.value).endswith("Fix: lease_ttl=0.3 and leave lease_renew_interval unset")
    with pytest.raises(LeaseConfigError) as info:
        beat_settings(
            {"lease_backend": "redis://h/0", "lease_beat_ttl": 0.2, "lease_renew_interval": 5.0}
        )
    assert str(info.value).endswith("Fix: lease_beat_ttl=0.3")
    beat_settings(
        {"lease_backend": "redis://h/0", "lease_beat_ttl": 0.3, "lease_renew_interval": 5.0}
    )


def test_every_invalid_value_is_reported_in_one_error() -> None:
    with pytest.raises(LeaseConfigError) as info:
        register(
            make_app(),
            lease_ttl="30",
            lease_on_conflict="later",
            lease_key_prefix="a{b",
            lease_min_replicas=-1,
        )
    message = str(info.value)
    assert message.startswith("4 invalid lease settings (task ")
    assert "\n" not in message
    for named in (
        "lease_ttl='30' must be a number of seconds",
        "lease_key_prefix='a{b'",
        "lease_min_replicas=-1",
        "lease_on_conflict='later' is not one of",
    ):
        assert named in message


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("lease_dedupe", "true", "must be True or False"),
        ("lease_dedupe", 1, "must be True or False"),
        ("lease_dedupe_ttl", 0, "above zero"),
        ("lease_dedupe_ttl", "300", "number of seconds"),
    ],
)
def test_lease_dedupe_and_its_ttl_are_checked_at_registration(
    option: str, value: object, says: str
) -> None:
    with pytest.raises(LeaseConfigError, match=f"{option}=.*{says}"):
        register(make_app(), **{option: value})
    with pytest.raises(LeaseConfigError, match=option):
        register(make_app(**{option: value}))


def test_lease_dedupe_defaults_off_with_a_five_minute_claim_lifetime() -> None:
    options = register(make_app()).lease_settings().options
    assert (options.dedupe, options.dedupe_ttl) == (False, 300.0)
    options = register(make_app(lease_dedupe=True), lease_dedupe_ttl=12.5).lease_settings().options
    assert (options.dedupe, options.dedupe_ttl) == (True, 12.5)
