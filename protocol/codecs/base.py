"""What a codec is: the rule for what one site may put in a response body, and how it is read."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar


class PayloadError(ValueError):
    """A response body the codec refuses; str(error) is the reason."""


class Codec(ABC):
    name: ClassVar[str]

    @abstractmethod
    def encode(self, value: Any) -> Any:
        """Site side: the site half's value -> a msgpack-able body."""

    @abstractmethod
    def decode(self, body: Any) -> Any:
        """Coordinator side: a received body -> the value, or PayloadError."""

    @abstractmethod
    def information_bits(self, value: Any) -> int:
        """The information a decoded value carries, in bits: what the protocol must convey at the
        least, against which the ledger's wire bytes show the overhead."""
