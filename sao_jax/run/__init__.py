"""Services one run uses: what it starts from (`bootstrap`: initial policy, chat
format, run tokenizer), checkpoints, metrics and tracking, storage paths and the
run-directory lock."""
