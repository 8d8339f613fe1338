"""Chat formats: the checkpoint's own template or ChatML, rendered turn by turn."""

from sao_jax.chat.format import ROLES, ChatFormat, TurnTextError, chat_format, load_chat

__all__ = ["ROLES", "ChatFormat", "TurnTextError", "chat_format", "load_chat"]
