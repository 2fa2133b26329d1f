"""Lease keys from call arguments: spellings, types, subsets, bound tasks, hash tags."""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

from celery_lease import LeasedTask, LeaseKeyError
from celery_lease.base.keys import (
    INTERNAL_SUFFIXES,
    beat_leader_key,
    encode_value,
    fence_key,
    is_internal,
    last_run_key,
)


def make_app() -> Celery:
    app = Celery("keys", broker="memory://", set_as_current=False)
    app.conf.lease_backend = "redis://127.0.0.1:1/0"
    return app


def task_of(fn: Callable[..., Any], **options: Any) -> LeasedTask:
    return make_app().task(base=LeasedTask, shared=False, **options)(fn)  # type: ignore[no-any-return]


def f(a: Any, b: Any = 2) -> None:
    pass


def test_call_spellings_take_the_same_lease() -> None:
    task = task_of(f)
    spellings = [
        ((1, 2), {}),
        ((1,), {"b": 2}),
        ((), {"a": 1, "b": 2}),
        ((), {"b": 2, "a": 1}),
        ((1,), {}),
    ]
    keys = {task.lease_key_for(args, kwargs) for args, kwargs in spellings}
    assert len(keys) == 1
    assert task.lease_key_for((1, 3)) not in keys


def test_argument_types_are_distinguished() -> None:
    values = [1, "1", True, 1.0, None, b"1", [1], {"1": 1}, {1: 1}, decimal.Decimal("1")]
    assert len({encode_value(v) for v in values}) == len(values)
    assert encode_value((1, 2)) == encode_value([1, 2])  # as after a JSON round trip


def test_serializer_types_produce_a_key() -> None:
    task = task_of(f)
    key = task.lease_key_for(
        (
            uuid.uuid4(),
            {
                "when": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
                "d": dt.date(2026, 1, 1),
                "amount": decimal.Decimal("1.50"),
                "raw": b"\x00\xff",
                3: {"nested": {4: [1, 2]}},
                "s": {3, 1, 2},
                "dur": dt.timedelta(seconds=5),
            },
        )
    )
    assert key.startswith("lease:{")


def test_unencodable_argument_error_names_task_and_parameter() -> None:
    task = task_of(f)
    with pytest.raises(LeaseKeyError) as info:
        task.lease_key_for((object(),))
    message = str(info.value)
    assert task.name in message and "'a'" in message and "object" in message
    assert "0x" not in message  # never a repr with a memory address


def test_a_one_megabyte_argument_gives_a_short_key() -> None:
    key = task_of(f).lease_key_for(("x" * 1_000_000,))
    assert len(key) < 200


def test_long_task_names_and_custom_keys_are_bounded() -> None:
    task = task_of(f, name="t" * 500)
    assert len(task.lease_key_for((1,))) < 300
    custom = task_of(f, name="c", lease_key=lambda a, b=2: "k" * 10_000)
    assert len(custom.lease_key_for((1,))) < 300


def test_sets_and_dicts_do_not_depend_on_hash_seed() -> None:
    code = (
        "from celery_lease.base.keys import encode_value; "
        "print(encode_value({'x', 'y', 'z', 'w'}).hex(), "
        "encode_value({'b': 1, 'a': 2, 'c': {'z', 'q'}}).hex())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(seed), "PATH": ""},
        ).stdout
        for seed in (1, 2, 3)
    }
    assert len(outs) == 1


def test_key_subset_counts_defaults_and_empty_subset_keys_on_name() -> None:
    task = task_of(f, lease_key=("b",))
    assert task.lease_key_for((1,)) == task.lease_key_for((9,), {"b": 2})
    assert task.lease_key_for((1,)) != task.lease_key_for((1, 3))
    per_name = task_of(f, name="per.name", lease_key=())
    assert per_name.lease_key_for((1,)) == per_name.lease_key_for((2, 3)) == "lease:{per.name}"


def test_bound_task_with_subset_never_keys_on_self() -> None:
    app = make_app()

    @app.task(bind=True, base=LeasedTask, lease_key=("account",), shared=False)  # type: ignore[misc]
    def sync(self: Any, account: int, day: str = "today") -> None:
        pass

    assert sync.lease_key_for((7, "a")) == sync.lease_key_for((7,), {"day": "b"})
    assert sync.lease_key_for((7,)) != sync.lease_key_for((8,))


def test_signature_is_read_through_wrappers() -> None:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return wrapper

    task = task_of(deco(f))
    assert task.lease_key_for((1,)) == task.lease_key_for((), {"a": 1, "b": 2})


def test_callable_key_lets_tasks_share_a_lease() -> None:
    def by_account(account: int, *_: Any, **__: Any) -> str:
        return f"account-{account}"

    one = task_of(f, name="one", lease_key=by_account)
    two = task_of(f, name="two", lease_key=by_account)
    assert one.lease_key_for((5,)) == two.lease_key_for((5,)) == "lease:{account-5}"


def test_bad_arguments_are_a_key_error_naming_the_task() -> None:
    with pytest.raises(LeaseKeyError, match="do not fit"):
        task_of(f, name="bad").lease_key_for((1, 2, 3))


def test_braces_in_names_and_custom_keys_cannot_move_the_hash_tag() -> None:
    from celery_lease.base.keys import fence_key

    odd_name = task_of(f, name="odd}name")
    odd_key = task_of(f, name="c2", lease_key=lambda a, b=2: "}x{")
    for task in (odd_name, odd_key):
        key = task.lease_key_for((1,))
        tag = key[key.index("{") + 1 : key.index("}")]
        assert key.endswith("}") and "{" not in tag
        fence = fence_key(key)
        assert fence[fence.index("{") + 1 : fence.index("}")] == tag


def test_bad_lease_key_callable_and_self_referential_argument_name_the_task() -> None:
    with pytest.raises(LeaseKeyError, match="lease_key callable does not take"):
        task_of(f, name="cb", lease_key=lambda: "k").lease_key_for((1,))
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(LeaseKeyError, match="'a' contains itself"):
        task_of(f, name="loop").lease_key_for((loop,))


def test_every_key_written_beside_a_lease_shares_its_hash_tag_and_is_known_internal() -> None:
    lease = "lease:{proj.sync:abc}"
    leader = beat_leader_key("lease", "proj")
    assert leader == "lease:{celery.beat:proj}"
    for key in (fence_key(lease), last_run_key(leader)):
        assert is_internal(key) and key.endswith(INTERNAL_SUFFIXES)
    assert fence_key(lease).split("{")[1].split("}")[0] == "proj.sync:abc"
    assert not is_internal(lease) and not is_internal(leader)


def test_the_task_module_does_not_import_the_worker_module() -> None:
    code = (
        "import sys, celery_lease.execution.task; "
        "assert 'celery_lease.worker' not in sys.modules, 'task imports worker'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_type_error_inside_a_lease_key_callable_is_reported_as_that_bug() -> None:
    def key_of(account: Any, b: Any = 2) -> str:
        return "account-" + account  # the bug: str + int

    task = task_of(f, name="buggy", lease_key=key_of)
    with pytest.raises(TypeError) as info:
        task.lease_key_for((7,))
    assert not isinstance(info.value, LeaseKeyError)
    assert "can only concatenate str" in str(info.value)
    frames = [entry.name for entry in info.traceback]
    assert frames[-1] == "key_of"  # the original traceback, down to the faulty line
    if sys.version_info >= (3, 11):
        assert info.value.__notes__ == ["raised by the lease_key callable of task buggy"]
    # A callable that does not take the call's arguments is still named as such.
    with pytest.raises(LeaseKeyError, match="lease_key callable does not take"):
        task.lease_key_for((1, 2, 3))


@pytest.mark.parametrize("args", ["42", b"42", 42, {"a": 1}, {4, 2}])
def test_lease_key_for_refuses_arguments_that_are_not_a_list_or_tuple(args: Any) -> None:
    task = task_of(f, name="acct")
    with pytest.raises(LeaseKeyError, match=r"task acct: lease_key_for\(args=.*list or tuple"):
        task.lease_key_for(args)
    assert task.lease_key_for(["42"]) == task.lease_key_for(("42",)) != task.lease_key_for(("4",))
    with pytest.raises(LeaseKeyError, match="keyword arguments as a dict"):
        task.lease_key_for((1,), [("b", 2)])  # type: ignore[arg-type]
