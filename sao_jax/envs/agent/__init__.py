"""Bring your own agent: programs that call an OpenAI-compatible endpoint, trained token for token.

`env.name="agent"` (`spec`) runs `env.options.program` once per task (`env.AgentEnv`)
against the endpoint this process serves (`server`, OpenAI's request and response
shapes in `protocol`); docs/tutorials/train-your-agent.md shows it end to end.
"""
