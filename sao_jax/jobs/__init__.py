"""Jobs a command starts: training (`train`), evaluation (`evaluate`, `eval_scores`)
and the SFT warm-start (`warm_start`). Nothing inside the package imports from here;
`sao_jax.cli` and `experiments` call in."""
