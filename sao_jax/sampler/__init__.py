"""Rollout sampling: the continuous-batching generation engine and its device steps.

`engine.Engine` is the API a sampler worker drives (submit / step / finish);
`steps` holds the jitted prefill and decode programs; `sampling` the token draw.
"""
