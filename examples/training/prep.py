"""Python preprocessors for `dataPipeline.preprocessor: python:prep.<function>`.

`basecamp data preprocess` imports this module (from the trainer image: the
`dataset` init container runs there) and calls the function once per plan
step of every trace with one record, a dict with `task`, `variant`,
`episode`, `step`, `action`, `observation`, `previous_observation`,
`status`, `error_type`, `fallback_used`, `latency_ms`, `memory_before`,
`memory_after`, `memory_deltas`, `truncated` and, on the last step of an
episode that ended with a reward, `episode_reward` and `reward_components`
(scored by the sandbox's own reward calculator). `truncated` is true when
the episode's trace has no end (the sandbox was killed, the trace was cut
off): its reward is unknown and its records have no `episode_reward`; the
row keeps `truncated`, so a trainer can leave it out. It must return
`[state, action, reward]`: two dicts and a number.
"""


def shipping_delay_filter(record: dict) -> list:
    """What the agent knew and did at this step; a step whose tool fell back
    (timeout, 429) costs half a point, so the policy learns to retry."""
    state = {"memory": record.get("memory_before") or {}, "previous_observation": record.get("previous_observation")}
    reward = float(record.get("episode_reward") or 0.0) - (0.5 if record.get("fallback_used") else 0.0)
    return [state, record.get("action") or {}, reward]


def wrong_shape(record: dict) -> dict:
    """A broken preprocessor, kept as a fixture (e2e/test_70_training.py):
    a dict instead of [state, action, reward], which basecamp refuses on the
    first record with a message saying what it expected."""
    return {"state": record.get("memory_before"), "action": record.get("action")}
