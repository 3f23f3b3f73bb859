"""Where a conversation's last message ends inside its rendered chat template.

An end-of-turn score asks the model how likely its end-of-turn marker is right after the host's words so
far (LiveKit's turn detector uses a small LM this way). The rendered prompt is cut right after the last
message's text: what comes before is fed to the model, and the first token of what comes after is the
template's own end-of-turn marker (``<|im_end|>`` for ChatML, ``<|eot_id|>`` for Llama 3, ...).
"""

from __future__ import annotations


def split_at_last_message(rendered: str, content: str) -> tuple[str, str]:
    """``(head, tail)``: ``rendered`` cut right after the last occurrence of ``content``."""
    text = content.rstrip()
    at = rendered.rfind(text) if text else -1
    if at < 0:
        raise ValueError("the last message's text does not appear in the rendered prompt")
    cut = at + len(text)
    return rendered[:cut], rendered[cut:]
