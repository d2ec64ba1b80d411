"""The trainer's side of the trajectory API: waiting for data is reported, not silent."""

from __future__ import annotations

from atropos_cli.api.client import TrainerRegistration, iter_batches


def test_a_trainer_waiting_for_data_says_what_it_waits_for_now_and_then(trajectory_api):
    api = trajectory_api()
    said: list[str] = []
    batches = iter_batches(
        api.url,
        TrainerRegistration(batch_size=4),
        idle_timeout=1.5,
        poll_interval=0.02,
        on_wait=said.append,
        wait_report_every=0.5,
    )
    assert list(batches) == []  # no env posted: it gives up after idle_timeout
    assert 1 <= len(said) <= 2, said  # a line now and then, not one per poll (~75 polls)
    assert f"waiting for a batch of 4 from the trajectory API at {api.url}" in said[0]
    assert "0 groups queued" in said[0] and "giving up after 2s" in said[0]
