"""ScoredGroup: Atropos-compatible fields, validation that names the bad rollout, the exact ScoredData dict."""

import math

import pytest
from pydantic import ValidationError

from atropos_cli.types import SCORED_DATA_KEYS, GroupMeta, ScoredGroup


def atropos_group(**changes):
    group = {
        "tokens": [[1, 2, 3], [1, 2, 4, 5]],
        "masks": [[-100, 2, 3], [-100, 2, 4, 5]],
        "scores": [1.0, 0.0],
        "messages": [[{"role": "user", "content": "q"}], [{"role": "user", "content": "q", "reward": 1}]],
    }
    group.update(changes)
    return group


def test_atropos_payload_parses_and_round_trips_to_the_14_keys():
    group = ScoredGroup.model_validate({**atropos_group(), "env_id": 3, "unknown_extra": 1})
    data = group.to_scored_data()
    assert tuple(data) == SCORED_DATA_KEYS
    assert data["env_id"] == 3 and data["advantages"] is None
    assert data["messages"][1][0]["reward"] == 1  # extra message keys survive


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"masks": [[-100, 2, 3], [-100, 2, 4]]}, "rollout 1: tokens has 4 entries but masks has 3"),
        ({"scores": [1.0]}, "tokens has 2 rollouts but scores has 1"),
        ({"scores": []}, "group is empty"),
        ({"scores": [1.0, math.nan]}, "rollout 1: score is nan"),
        ({"inference_logprobs": [[1.0, 1.0, -0.5], [1.0]]}, "rollout 1: inference_logprobs has 1 entries"),
        ({"messages": [[{"role": "user"}], []]}, "rollout 0: message 0 needs 'role' and 'content'"),
    ],
)
def test_validation_names_the_bad_rollout(changes, message):
    with pytest.raises(ValidationError) as info:
        ScoredGroup.model_validate(atropos_group(**changes))
    assert message in str(info.value)


def test_group_without_tokens_is_valid_but_cannot_be_trained_on():
    group = ScoredGroup(scores=[0.5, 1.0], messages=[[{"role": "user", "content": "a"}]] * 2)
    assert not group.has_tokens
    with pytest.raises(ValueError, match="no token ids"):
        group.require_tokens()


def test_record_keeps_meta_and_drops_empty_optionals():
    group = ScoredGroup.model_validate({**atropos_group(), "meta": GroupMeta(env="arithmetic", index=4)})
    record = group.to_record()
    assert record["meta"]["env"] == "arithmetic" and record["meta"]["index"] == 4
    assert "advantages" not in record
    assert ScoredGroup.model_validate(record) == group
