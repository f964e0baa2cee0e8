"""A model's chat template as role markers: the text before and after each role's content.

The backend derives the markers by rendering the model's own template; `default_system_prompt`
is inserted before the first message when that message is not a system one, as the template
does. A model without a template gets `PLAIN_TEMPLATE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant")


@dataclass(slots=True, frozen=True)
class ChatTemplate:
    """Role -> (prefix, suffix) markers, plus the system prompt the template adds by itself."""

    roles: dict[str, tuple[str, str]]
    default_system_prompt: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ChatTemplate:
        """Parse the backend's `get_chat_template()` dict (None or no roles: the plain one)."""
        if not data or not data.get("roles"):
            return PLAIN_TEMPLATE
        roles: dict[str, tuple[str, str]] = {}
        for role, markers in data["roles"].items():
            if (
                not isinstance(markers, list | tuple)
                or len(markers) != 2
                or not all(isinstance(m, str) for m in markers)
            ):
                raise ValueError(f"chat template role {role!r} needs [prefix, suffix]: {markers!r}")
            roles[role] = (markers[0], markers[1])
        return cls(roles=roles, default_system_prompt=data.get("default_system_prompt"))

    def to_dict(self) -> dict[str, Any]:
        """The backend's `get_chat_template()` form of this template."""
        roles = {role: list(markers) for role, markers in self.roles.items()}
        return {"roles": roles, "default_system_prompt": self.default_system_prompt}

    def markers(self, role: str) -> tuple[str, str]:
        """(prefix, suffix) of `role`."""
        if role not in self.roles:
            known = list(self.roles)
            raise ValueError(f"this model's chat template has no role {role!r}; it has {known}")
        return self.roles[role]

    @property
    def assistant_stop(self) -> str | None:
        """The assistant suffix's visible end marker (e.g. "<|im_end|>"), used as a stop string."""
        suffix = self.roles.get("assistant", ("", ""))[1].strip()
        return suffix or None


PLAIN_TEMPLATE = ChatTemplate(
    roles={"system": ("", "\n\n"), "user": ("User: ", "\n"), "assistant": ("Assistant: ", "\n")}
)
