"""What a codec is: the rule for what one site may put in a response body, and how it is read."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar


class PayloadError(ValueError):
    """A response body the codec refuses; str(error) is the reason."""


class Codec(ABC):
    name: ClassVar[str]
    #: where a site sends what it encodes: straight to the coordinator, or to the shuffler
    #: process, which forwards a permuted batch (protocol.shuffle)
    route: ClassVar[str] = "direct"

    def wrap_request(self, body: dict) -> dict:
        """Coordinator side: a request body as sent, with anything the site's encoder needs
        (e.g. a key to seal to). Most codecs send the method's body unchanged."""
        return body

    @classmethod
    def for_site(cls, body: dict) -> tuple["Codec", dict]:
        """Site side: (the encoder for this request, the method's own request body);
        raises PayloadError for a wrapped body it cannot read."""
        return cls(), body

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
