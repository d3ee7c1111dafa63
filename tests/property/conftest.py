"""Fixtures: each door (an engine, the coordinator's front door) started once per module."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.property.pool import Door, EngineDoor, FrontDoor
from tests.support.engine import SMOLLM, models_dir


def _need_model() -> None:
    if not (models_dir() / SMOLLM).is_file():
        pytest.skip(f"model file {models_dir() / SMOLLM} is missing (scripts/setup fetches it)")


@pytest.fixture(scope="module")
def engine_door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineDoor]:
    _need_model()
    d = EngineDoor(tmp_path_factory.mktemp)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def front_door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    _need_model()
    d = FrontDoor(tmp_path_factory.mktemp)
    yield d
    d.stop()


@pytest.fixture(scope="module", params=["engine", "front"])
def door(request: pytest.FixtureRequest) -> Door:
    return request.getfixturevalue(f"{request.param}_door")
