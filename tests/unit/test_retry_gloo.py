"""The tests' retry of torch's gloo exit abort: it reruns only that failure, in a fresh folder,
and a real failure still fails at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import GLOO_EXIT_ABORT, retry_gloo_exit_abort


def test_the_gloo_exit_abort_runs_the_test_again_in_a_fresh_folder(tmp_path: Path) -> None:
    folders: list[Path] = []

    @retry_gloo_exit_abort
    def job(tmp_path: Path) -> None:
        folders.append(tmp_path)
        assert len(folders) == 2, f"stderr: ...\n{GLOO_EXIT_ABORT}\n..."

    with pytest.warns(UserWarning, match="gloo exit abort; attempt 2"):
        job(tmp_path=tmp_path)
    assert folders == [tmp_path, tmp_path / "retry1"] and folders[1].is_dir()


def test_any_other_failure_fails_at_once_and_the_abort_three_times_fails(tmp_path: Path) -> None:
    calls = []

    @retry_gloo_exit_abort
    def wrong(tmp_path: Path) -> None:
        calls.append(tmp_path)
        raise AssertionError("grad norm 0.0 != 1.5")

    with pytest.raises(AssertionError, match="grad norm"):
        wrong(tmp_path=tmp_path)
    assert calls == [tmp_path]

    @retry_gloo_exit_abort
    def always(tmp_path: Path) -> None:
        calls.append(tmp_path)
        raise AssertionError(GLOO_EXIT_ABORT)

    with pytest.warns(UserWarning), pytest.raises(AssertionError, match=GLOO_EXIT_ABORT):
        always(tmp_path=tmp_path)
    assert len(calls) == 4  # 1 + 3 attempts
