"""The shuffler's logic, sans I/O: collect one batch of sealed messages, permute, forward.

For a shuffled phase the coordinator opens a batch at the shuffler (the sites expected, a
deadline and the fewest messages the session's privacy was planned for), waits until the shuffler
says the batch is open (`batch_ready`), and only then sends its requests, so no site's answer can
reach the shuffler before its batch exists, whatever the load; each site seals its answer to the coordinator's session key
(protocol.codecs.shuffle) and sends the ciphertext to the shuffler. A batch accepts at most one
ciphertext per expected site, refuses an exact copy of a ciphertext it already holds (a replay
under another name), and is forwarded when every expected site sent or the deadline passed:
the ciphertexts in a uniformly random order drawn from the operating system's CSPRNG, with the
set of senders (who took part is no secret; who sent what is) and nothing else about them.
A batch holding fewer ciphertexts than its `minimum` is withheld: the shuffler forwards the
senders and the reason but no ciphertext, because the amplification the sites' local epsilon
was chosen for needs that many messages in the shuffle (stats.amplification).

The minimum is not the coordinator's word alone (issue 35): each sealed message carries, outside
its ciphertext, the site's own `claim` (`sealing_claim`): the fewest messages its answer's
privacy was planned for (what the site booked), a digest of the key it sealed to, and the
digest of the question it answers (issue 47: Method.request_digest, computed by the site from
the request it received, per-site fields left out). The shuffler forwards only messages sealed
to one key (a coordinator that hands each site its own key would know who sent what) that answer
one question (a coordinator that asks one site for 1,000 bins where the others get 100 would
pick its answer out of the permuted batch, and the site's amplified epsilon would be a fiction),
each of whose claims the forwarded batch backs: the odd ones out are left out and named (the
largest group kept; a tie withholds the batch), so that one lying site is a dropout and not the
end of everyone's release (issue 50's red team); fewer messages than the batch's minimum, or
than the claims of the messages kept, withhold it; a malformed claim refuses the message.
The shuffler holds ciphertexts only: it has no key that opens them.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field

from protocol.accounting import MAX_CLAIMED

MAX_CIPHERTEXT = 4096
KEY_DIGEST_BYTES = 16
REQUEST_DIGEST_BYTES = 32  # a full SHA-256: the coordinator chooses both questions, so collisions count
MAX_REASON = 600  # characters of a withheld batch's reason (the wire admits 1,000)


def sealing_claim(messages: int, seal_to: bytes, request: bytes) -> dict:
    """What a site's sealed message claims for the shuffler to check: the fewest messages the
    answer's privacy was planned for, the first 16 bytes of SHA-256 of the key it sealed to, and
    the request digest of the question it answers (Method.request_digest, 32 bytes)."""
    return {"messages": int(messages), "key": hashlib.sha256(seal_to).digest()[:KEY_DIGEST_BYTES],
            "request": bytes(request)}


def claim_problem(claim) -> str | None:
    """Why a claim is malformed (None when it is sound)."""
    if not isinstance(claim, dict) or set(claim) != {"messages", "key", "request"}:
        return "a claim must be {messages, key, request}"
    messages, key, request = claim["messages"], claim["key"], claim["request"]
    if isinstance(messages, bool) or not isinstance(messages, int) or not 1 <= messages <= MAX_CLAIMED:
        return f"claimed messages must be an integer in [1, {MAX_CLAIMED}]"
    if not isinstance(key, bytes) or len(key) != KEY_DIGEST_BYTES:
        return f"the key digest must be {KEY_DIGEST_BYTES} bytes"
    if not isinstance(request, bytes) or len(request) != REQUEST_DIGEST_BYTES:
        return f"the request digest must be {REQUEST_DIGEST_BYTES} bytes"
    return None


def secure_permutation(count: int) -> list[int]:
    """A uniformly random permutation of range(count): Fisher-Yates with `secrets.randbelow`
    (the OS CSPRNG), so that no seed, and nothing the coordinator knows, predicts it."""
    order = list(range(count))
    for i in range(count - 1, 0, -1):
        j = secrets.randbelow(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def anonymous_label(index: int) -> str:
    """The key under which the coordinator hands the method the index-th message of a shuffled
    batch: a position in the permuted batch, never a site id."""
    return f"#{index:05d}"


@dataclass
class ShuffleBatch:
    session: int
    phase: str
    expected: frozenset[str]
    minimum: int = 0  # fewer ciphertexts than this: withheld (the planned amplification is not there)
    received: dict[str, bytes] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # wire bytes of each accepted message
    refused: dict[str, str] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)  # expected senders whose connection was lost
    claims: dict[str, dict] = field(default_factory=dict)  # each accepted sender's sealing_claim

    def lose(self, sender: str, reason: str) -> None:
        """`sender`'s connection closed before its message came: stop waiting for it."""
        if sender in self.expected and sender not in self.received:
            self.lost.add(sender)
            self.refused.setdefault(sender, reason)

    def offer(self, sender: str, phase: str, ciphertext: bytes, nbytes: int = 0, claim=None) -> str | None:
        """None if accepted, else why not (for the shuffler's log)."""
        if phase != self.phase:
            return f"sealed message for phase {phase!r} while phase {self.phase!r} is open"
        if sender not in self.expected:
            return f"{sender} is not expected in this batch"
        if sender in self.received:
            return f"second sealed message from {sender} in this batch"
        if sender in self.lost:
            return f"{sender} was counted out of this batch ({self.refused.get(sender, 'lost')})"
        if not isinstance(ciphertext, bytes) or not 0 < len(ciphertext) <= MAX_CIPHERTEXT:
            self.refused.setdefault(sender, "ciphertext of impossible length")
            return f"ciphertext from {sender} of impossible length"
        problem = claim_problem(claim)
        if problem:
            self.refused.setdefault(sender, f"malformed claim: {problem}")
            return f"malformed claim from {sender}: {problem}"
        if ciphertext in self.received.values():
            self.refused.setdefault(sender, "copy of a ciphertext already in the batch")
            return f"{sender} sent a copy of a ciphertext already in the batch (replay)"
        self.received[sender] = ciphertext
        self.claims[sender] = claim
        self.sizes[sender] = nbytes
        self.refused.pop(sender, None)
        return None

    @property
    def complete(self) -> bool:
        return set(self.received) | self.lost >= self.expected

    @property
    def withheld(self) -> str:
        """Why no ciphertext may be forwarded ("" when some may): see `selection`."""
        return self.selection()[2]

    def selection(self) -> tuple[list[str], dict[str, str], str]:
        """(the senders whose messages are forwarded, {sender left out: why}, why nothing is
        forwarded or ""). One key and one question for every forwarded message: when messages
        were sealed to different keys or answer different questions, the largest group is kept
        and the others left out, naming them (a tie keeps none: the batch is withheld), so that
        one site sealing to another key or claiming another question is a dropout, not the end of
        everyone's release. Then every forwarded message's claim must be backed: the largest k
        such that the k smallest claims are at most k are kept (a site claiming more than the batch
        holds is left out), and the batch is withheld when k is below its minimum."""
        senders = sorted(self.received)
        groups: dict[tuple[bytes, bytes], list[str]] = {}
        for sender in senders:
            groups.setdefault((self.claims[sender]["key"], self.claims[sender]["request"]), []).append(sender)
        left: dict[str, str] = {}
        if len(groups) > 1:
            ranked = sorted(groups.values(), key=len, reverse=True)
            if len(ranked[0]) == len(ranked[1]):
                keys = {key for key, _ in groups}
                if len(keys) > 1:
                    return [], {}, (f"withheld by the shuffler: the {len(senders)} sealed messages were sealed to "
                                    f"{len(keys)} different keys (one session key is needed, or senders could be "
                                    f"told apart)")
                return [], {}, different_questions(self.questions())
            kept_key, kept_request = next(k for k, group in groups.items() if group is ranked[0])
            for sender in senders:
                claim = self.claims[sender]
                if claim["key"] != kept_key:
                    left[sender] = (f"left out of the batch: sealed to another key than the other {len(ranked[0])} "
                                    f"messages (one session key for all)")
                elif claim["request"] != kept_request:
                    left[sender] = (f"left out of the batch: it answers another request (request "
                                    f"{claim['request'][:4].hex()}) than the other {len(ranked[0])} messages "
                                    f"(request {kept_request[:4].hex()}): different requests, one question for all")
            senders = ranked[0]
        by_claim = sorted(senders, key=lambda sender: (self.claims[sender]["messages"], sender))
        kept = 0
        for k in range(len(by_claim), 0, -1):
            if self.claims[by_claim[k - 1]]["messages"] <= k:
                kept = k
                break
        if kept < max(self.minimum, 1):
            claimed = max((self.claims[sender]["messages"] for sender in senders), default=0)
            arrived = (f"{len(senders)} sealed messages arrived" if not left else
                       f"{len(senders)} sealed messages of one key and one question arrived")
            if claimed > self.minimum:
                return [], left, (f"withheld by the shuffler: {arrived}, fewer than the {claimed} a site's answer "
                                  f"was planned (and booked) for")
            return [], left, (f"withheld by the shuffler: {arrived}, fewer than the {self.minimum} the session's "
                              f"privacy was planned for")
        for sender in by_claim[kept:]:
            left[sender] = (f"left out of the batch: its claim of {self.claims[sender]['messages']} messages is more "
                            f"than the {kept} the batch can forward")
        return sorted(by_claim[:kept]), left, ""

    def questions(self) -> dict[bytes, list[str]]:
        """The senders of the accepted messages by the request digest their claims name."""
        by_digest: dict[bytes, list[str]] = {}
        for sender in sorted(self.claims):
            by_digest.setdefault(self.claims[sender]["request"], []).append(sender)
        return by_digest

    def forward(self) -> dict:
        """The `batch` payload: the selected ciphertexts (`selection`) in a fresh random order, their
        senders sorted; no ciphertext at all when the batch is withheld (then every sender that
        arrived and was not left out is named as a sender, with the reason)."""
        kept, left, withheld = self.selection()
        senders = sorted(set(self.received) - set(left)) if withheld else kept
        items = [] if withheld else [self.received[s] for s in kept]
        order = secure_permutation(len(items))
        refused = {**self.refused, **left}
        return {"phase": self.phase, "ciphertexts": [items[i] for i in order], "senders": senders,
                "refused": {s: r for s, r in sorted(refused.items()) if s not in senders},
                "received": {s: self.sizes[s] for s in sorted(self.received)}, "withheld": withheld}


def different_questions(questions: dict[bytes, list[str]], groups_shown: int = 2, names_shown: int = 3) -> str:
    """The reason a batch whose messages answer different questions is withheld: how many
    requests, and the smallest groups (the odd ones out) with a few senders each and their
    digests' first bytes; at most MAX_REASON characters, however many sites and requests."""
    groups = sorted(questions.items(), key=lambda item: (len(item[1]), item[1]))
    total = sum(len(senders) for _, senders in groups)

    def group(digest: bytes, senders: list[str]) -> str:
        names = ", ".join(senders[:names_shown]) + (f" and {len(senders) - names_shown} more"
                                                     if len(senders) > names_shown else "")
        return f"{len(senders)} from {names} (request {digest[:4].hex()})"

    shown = "; ".join(group(d, s) for d, s in groups[:groups_shown])
    if len(groups) > groups_shown:
        shown += f"; {len(groups) - groups_shown} more requests"
    reason = (f"withheld by the shuffler: the {total} sealed messages answer {len(groups)} different requests: "
              f"{shown} (one question for every contributor, or an answer could be told apart by its question)")
    return reason if len(reason) <= MAX_REASON else reason[:MAX_REASON - 3] + "..."
