"""The persona memory bank: who the idol is, what she remembers, and a guard that keeps her in
character. The engine uses :class:`PersonaPromptProvider` (``persona.prompt``) through its
``PromptProvider`` seam; everything else stands on its own (``docs/persona.md``)."""

from persona.card import CardError, PersonaCard, load_card
from persona.guard import ConsistencyGuard
from persona.prompt import PersonaPromptProvider, ProviderSettings

__all__ = [
    "CardError",
    "ConsistencyGuard",
    "PersonaCard",
    "PersonaPromptProvider",
    "ProviderSettings",
    "load_card",
]
