"""A coordinator that attacks its own sites, as a scenario scripts it (issue 35).

Quorum's guarantees are stated against a curious coordinator; this module lets a scenario make
the coordinator play against the sites, over real site processes, so that the site-side
defences of a protocol can be tested (ours, or a plugin's). Each rule of the scenario's
`attacks:` list names an attack, the method label whose sessions it targets and the trials:

- `replay_noise`: the coordinator recomputes each site's Generator from the scenario seed, as
  if the site's privacy noise were seeded, and predicts its exponential-mechanism bin from the
  data the scenario made (an attacker holding a neighbouring data set does the same). With
  noise from the OS CSPRNG it predicts only as often as chance (the sum of p_i^2);
- `fabricated_table`: every K-anonymous join request carries a table of `bins` narrow bins
  over the current range instead of the real one; the report counts how many cell limits the
  sites released land on the bin holding the cell's last value (the paper's rule: all);
- `inflate_claim`: a shuffled or securely summed session claims `factor` times the messages
  or inputs it has, with the smaller central epsilon that count would back, so that sites
  would book less than they spend;
- `forbidden_method`: the session's sites are asked for another method, `ask` (by default
  `centralized`: every raw score), instead of the scenario's;
- `switch_method`: after the session's first phase, the sites are asked for `ask` within the
  same session, as if the session had changed its method;
- `batch_of_one`: a shuffled session asks one site and opens its batch for one message;
- `equivocate`: in a shuffled or securely summed session, one `target` site (by default the
  first) is asked another question than everyone else: `factor` times the bins (and, in a
  secure sum, the vector length to match), so that its answer could be picked out of the batch
  or summed as if it answered the same question (issue 47). The shuffler withholds a batch whose
  messages answer different requests; in a secure sum the target's neighbours and the target
  refuse to mask, and the session aborts with the reason.

- `sybil`: a shuffled session's batch also expects `count` senders of the coordinator's own
  making, which dial the shuffler under fresh CURVE keys and send sealed messages carrying the
  honest sites' claim, so that the batch would count them towards the amplification the sites
  booked (Sybil contributors);
- `substitute_keys`: in a secure sum's share phase, one `target` site (by default the first) is
  sent, for every peer, X25519 keys of the coordinator's own making in place of the peer's (a
  man in the middle). In the active mode their signatures do not verify and the target refuses
  (FORGED); in the semi-honest mode the target encrypts its shares to the coordinator, which
  opens them, rebuilds the target's self-mask seed and mask key from any t, and (sending the
  target ciphertexts of its own making in the mask phase, so that it masks) reads its input;
- `equivocate_survivors`: in the phase that names who survived (consistency in the active mode,
  unmask in the semi-honest one), every second site (sorted) that lists the `target` survivor
  (by default the first) is told instead that the target dropped, so that those send the
  target's mask-key shares while the others send its self-mask shares. The active mode's
  signed views disagree and no share is released (INCONSISTENT); the finding counts the
  target's shares of each kind the coordinator received against the threshold t.

- `repeat`: after the session, the same sites are asked the same question again in `times`
  fresh sessions of the same trial (averaging fresh noise away: a budget reset by new sessions);
- `replay_request`: the session's request is sent again `times` times within the same session
  (a second answer from the same half: a budget reset by replay).

Everything the sites did is reported (`AttackRecord`: asked, answered, refused and why, and
the attack's own finding), in attacks.csv, summary.json and the terminal. The attacks rewrite
only what the coordinator sends; the sites run unchanged.
"""

from __future__ import annotations

import math
import secrets
import struct
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from stats.randomness import site_rng

ATTACKS = ("replay_noise", "fabricated_table", "inflate_claim", "forbidden_method", "switch_method",
           "batch_of_one", "repeat", "replay_request", "sybil", "equivocate", "substitute_keys",
           "equivocate_survivors")

#: the most asks of `repeat` and `replay_request` (its fresh sessions take trial-local ids from
#: REPEAT_FIRST up, above any method's own session index)
REPEAT_MAX, REPEAT_FIRST = 400, 500

#: sybil: the forged senders' names (site-like, so that the wire takes them)
SYBIL_PREFIX = "sybil-"

#: the scenario's `attacks:` entries (scenarios.scenario validates them)
ATTACK_FIELDS = {
    "attack": {"type": "str", "choices": list(ATTACKS)},
    "method": {"type": "str"},  # a method label of the scenario
    "trials": {"type": "int_or", "choices": ["all"], "min": 0, "default": "all"},
    "ask": {"type": "str", "default": "centralized"},  # forbidden_method, switch_method
    "bins": {"type": "int", "min": 2, "max": 1 << 20, "default": 40_000},  # fabricated_table
    "factor": {"type": "float", "gt": 1, "default": 100.0},  # inflate_claim
    "times": {"type": "int", "min": 1, "max": REPEAT_MAX, "default": 10},  # repeat, replay_request
    "count": {"type": "int", "min": 1, "max": 100, "default": 5},  # sybil: forged senders; equivocate (bins times this)
    # equivocate: the site asked another question; substitute_keys: the site sent keys of the
    # coordinator's making; equivocate_survivors: the survivor named dropped to half ("": the first)
    "target": {"type": "str", "default": ""},
}


def attack_problem(attack: dict, method) -> str | None:
    """Why `attack` cannot target `method` (an instance), or None."""
    kind = attack["attack"]
    if kind == "replay_noise" and method.codec != "exp_mech_bins":
        return "a method whose sites answer an exponential-mechanism bin to the coordinator (codec exp_mech_bins)"
    if kind == "fabricated_table" and method.phase_table().first != "table":
        return "a K-anonymous table method (mwu_table, kanon_quantiles)"
    if kind == "inflate_claim" and method.codec not in ("shuffle", "secagg_ddg"):
        return "a shuffled or securely summed method (its requests carry a central claim)"
    if kind in ("batch_of_one", "sybil") and method.codec != "shuffle":
        return "a shuffled method"
    if kind in ("repeat", "replay_request") and (method.codec != "exp_mech_bins" or len(method.phase_table().steps) != 1):
        return "a one-phase method whose sites answer an exponential-mechanism bin (codec exp_mech_bins)"
    if kind == "equivocate" and method.codec not in ("shuffle", "secagg_ddg"):
        return "a shuffled or securely summed method (one question for every contributor is what it checks)"
    if kind in ("substitute_keys", "equivocate_survivors") and method.codec != "secagg_ddg":
        return "a securely summed method (codec secagg_ddg: it attacks the keys and survivor lists of SecAgg+)"
    return None


@dataclass
class AttackRecord:
    trial: int
    method: str
    attack: str
    asked: int = 0
    answered: int = 0
    refused: int = 0
    reasons: Counter = field(default_factory=Counter)
    finding: str = ""
    pinned: int = 0  # fabricated_table: released cell limits on the bin of the cell's last value
    cell_limits: int = 0

    def row(self) -> dict:
        return {"trial": self.trial, "method": self.method, "attack": self.attack, "asked": self.asked,
                "answered": self.answered, "refused": self.refused,
                "reasons": "; ".join(f"{n} x {reason}" for reason, n in self.reasons.most_common(3)),
                "finding": self.finding}


class Adversary:
    """The scenario's attack rules, applied by the coordinator's driver to the sessions they
    name; `truth` (site -> its values) is what the scenario made, for the attacks that test a
    release against the data (set per trial by the harness)."""

    def __init__(self, rules: list[dict], labels: list[str], seed: int) -> None:
        self.rules, self.labels, self.seed = list(rules), list(labels), seed
        self.truth: dict[str, np.ndarray] = {}
        self.records: list[AttackRecord] = []
        self.asked_otherwise = ""  # equivocate: what the target was asked, for the finding
        self.forged_tried: list[str] = []  # sybil: the senders the coordinator forged in this session
        self.forged_taken: set[str] = set()  # ... and those whose sealed message the shuffler took
        self.phase = ""  # the phase last rewritten (observe follows it, for the same phase)
        #: substitute_keys / equivocate_survivors: what the coordinator did and learnt in each
        #: session ((trial, session) -> SecureSumLie); `lie` is the session under way
        self.lies: dict[tuple[int, int], SecureSumLie] = {}
        self.lie = SecureSumLie()

    def rule_for(self, trial: int, label: str) -> dict | None:
        for rule in self.rules:
            if rule["method"] == label and rule["trials"] in ("all", trial):
                return rule
        return None

    def start(self, trial: int, label: str, rule: dict) -> AttackRecord:
        record = AttackRecord(trial, label, rule["attack"])
        self.records.append(record)
        self.asked_otherwise = ""
        self.lie = SecureSumLie()
        return record

    # -- rewriting what is sent ---------------------------------------------------------------

    def rewrite(self, rule: dict, phase: str, requests: dict[str, dict], minimum: int,
                phase_index: int) -> tuple[dict[str, dict], int]:
        """The requests (and the shuffled batch's minimum) the attacking coordinator sends instead."""
        kind = rule["attack"]
        self.phase = phase
        if kind == "substitute_keys":
            return self.lie.substitute(rule["target"], phase, requests), minimum
        if kind == "equivocate_survivors":
            return self.lie.equivocate(rule["target"], phase, requests), minimum
        if kind == "fabricated_table" and phase_index > 0:
            return {site: {**body, "limits": fabricated_limits(body["limits"], rule["bins"])}
                    for site, body in requests.items()}, minimum
        if kind == "inflate_claim":
            return {site: inflated(body, rule["factor"]) for site, body in requests.items()}, minimum
        if kind == "batch_of_one" and requests:
            first = sorted(requests)[0]
            return {first: requests[first]}, 1
        if kind == "equivocate" and requests:
            target = rule["target"] or sorted(requests)[0]
            if target not in requests:
                self.asked_otherwise = self.asked_otherwise or f"{target} was not asked in this session"
                return requests, minimum
            body, change = equivocated(requests[target], rule["factor"])
            if change:
                self.asked_otherwise = f"{target} was asked {change}"
            return {**requests, target: body}, minimum
        return requests, minimum

    # -- what came back -----------------------------------------------------------------------

    def observe(self, record: AttackRecord, rule: dict, session: int, requests: dict[str, dict],
                answers: dict, dropped: dict[str, str]) -> None:
        record.asked += len(requests)
        refused = {site: why for site, why in dropped.items()
                   if why.startswith("refused") or "withheld" in why or "left out of the batch" in why}
        record.refused += len(refused)
        record.answered += len(answers)
        record.reasons.update(_short(why) for why in refused.values())
        kind = rule["attack"]
        if kind == "replay_noise":
            self._replay(record, session, requests, answers)
        elif kind in ("inflate_claim", "batch_of_one"):
            record.finding = ("the claim was held: " + _short(next(iter(refused.values())))) if refused else (
                f"{len(answers)} answers released on the coordinator's word (trusted: docs/privacy.md)")
        elif kind == "sybil":
            record.finding = (f"{len(self.forged_tried)} forged senders (keys of the coordinator's making) dialled the "
                              f"shuffler; {len(self.forged_taken)} of their sealed messages were taken into the batch, "
                              f"which held {len(answers)} messages")
        elif kind in ("repeat", "replay_request"):
            where = "fresh sessions" if kind == "repeat" else "the same session"
            record.finding = (f"asked the same question {record.asked} times in all ({where} after the first): "
                              f"{record.answered} answers, {record.refused} refused; the sites' budget, not the "
                              f"coordinator, decided how many")
        elif kind == "equivocate":
            from protocol.secagg.protocol import LIES

            told = self.asked_otherwise or "no site was asked another question (nothing to change)"
            # a secure sum's sites catch it when they mask (the digest inside the shares) or, in the
            # active mode, earlier: the target's keys are signed for its question, not theirs
            unmasked = [why for _, why in sorted(refused.items()) if any(lie in why for lie in LIES)]
            withheld = [why for _, why in sorted(refused.items()) if "different requests" in why
                        and "left out of the batch" not in why]
            left = [(site, why) for site, why in sorted(refused.items()) if "left out of the batch" in why]
            if left:
                site, why = left[0]
                record.finding = (f"{told}; {len(left)} message{'s' if len(left) > 1 else ''} left out of the batch "
                                  f"({site}: " + _short(why.split("left out of the batch: ")[-1]) + ")"
                                  + ("; the rest withheld" if any("withheld" in w for w in refused.values())
                                     else f"; {record.answered} others forwarded"))
            elif unmasked:
                record.finding = (f"{told}; {len(unmasked)} sites refused, the sum was not unmasked: "
                                  + _short(unmasked[0].removeprefix("refused: ")))
            elif withheld:
                record.finding = f"{told}; the batch was withheld: " + _short(withheld[0].split("withheld by the shuffler: ")[-1])
            elif " not caught" in record.finding or not record.finding:
                record.finding = f"{told}; not caught: {record.answered} answers taken"
        elif kind in ("substitute_keys", "equivocate_survivors"):
            self.lies[(record.trial, session)] = self.lie
            self.lie.observe(kind, self.phase, answers, refused)
            record.finding = self.lie.finding(kind) or record.finding

    def observe_table(self, record: AttackRecord, release, site: str) -> None:
        """fabricated_table: how many of the released cell limits sit on the bin that holds the
        cell's last value (what the paper's rule would give away every time)."""
        values = np.asarray(self.truth.get(site, ()), dtype=float)
        values = np.sort(values[:, 0] if values.ndim == 2 else values)  # two_sample rows: (value, group)
        if values.size == 0 or release is None:
            return
        limits = np.asarray(release.limits, dtype=float)
        for cells in release.cells:
            for first, last, _ in cells[:-1]:
                lo, hi = limits[last], limits[last + 1]
                record.cell_limits += 1
                record.pinned += bool(np.any((values > lo) & (values <= hi)))
        record.finding = (f"{record.pinned} of {record.cell_limits} released cell limits sit on the bin of the "
                          f"cell's last value (the paper's first-limit rule: all of them)")

    def _replay(self, record: AttackRecord, session: int, requests: dict[str, dict], answers: dict) -> None:
        from stats.dp import Bins, exponential_mechanism_log_probabilities

        hits, chance = 0, 0.0
        for site, released in answers.items():
            body, values = requests.get(site), self.truth.get(site)
            if body is None or values is None:
                continue
            bins = Bins(float(body["bins"]["lo"]), float(body["bins"]["hi"]), int(body["bins"]["count"]))
            histogram = np.bincount(bins.index_of(values), minlength=bins.count)
            p = np.exp(exponential_mechanism_log_probabilities(histogram, float(body["level"]), float(body["epsilon"])))
            u = site_rng(self.seed, record.trial, session, site).random()
            predicted = int(min(np.searchsorted(np.cumsum(p), u, side="right"), bins.count - 1))
            hits += predicted == int(released)
            chance += float(np.sum(p ** 2))
        record.finding = (f"replayed {hits} of {len(answers)} releases from the scenario seed "
                          f"(chance alone: {chance:.1f})")


@dataclass
class SecureSumLie:
    """A lying coordinator's part in one secure sum (substitute_keys, equivocate_survivors): what
    it sent in place of the honest requests, the keys it made, and what it got from the answers.
    Everything here is the coordinator's own view; the sites run unchanged."""

    target: str = ""
    nonce: int | None = None
    threshold: int = 0
    advertised: dict = field(default_factory=dict)  # site -> its advertised {"c", "s"} public keys
    index: dict = field(default_factory=dict)  # site -> its Shamir index (the share requests')
    # substitute_keys
    keys: dict = field(default_factory=dict)  # the target's peer -> (c, s) private keys of the coordinator's making
    opened: dict = field(default_factory=dict)  # peer -> (s share, b share): the target's ciphertexts, opened
    context: bytes = b""  # the question's digest, as read in the target's own plaintexts
    rebuilt: tuple | None = None  # (mask key, self-mask seed) of the target, rebuilt from the opened shares
    key_matches: bool = False  # the rebuilt mask key is the private half of the s key the target advertised
    forged_to: list = field(default_factory=list)  # peers whose ciphertexts to the target the coordinator made
    read: str = ""  # the target's input as the coordinator read it from its masked vector
    # equivocate_survivors
    listers: list = field(default_factory=list)  # the sites whose view lists the target
    told_dropped: list = field(default_factory=list)  # ... of which these were told it dropped
    b_shares: dict = field(default_factory=dict)  # holder index -> share of the target's self-mask seed
    s_shares: dict = field(default_factory=dict)  # holder index -> share of the target's mask key
    unmask_seen: bool = False
    # both
    refused: dict = field(default_factory=dict)  # site -> "phase: why", the first refusal of each site
    note: str = ""  # why the attack could not be made as scripted

    # -- what the coordinator sends ------------------------------------------------------------

    def _session(self, phase: str, requests: dict[str, dict]) -> None:
        if phase == "advertise" and requests:
            body = next(iter(requests.values()))
            self.nonce = body.get("nonce")
            self.threshold = int((body.get("params") or {}).get("threshold") or 0)
        if phase == "share":
            self.index = {site: body.get("index") for site, body in requests.items()}

    def substitute(self, target: str, phase: str, requests: dict[str, dict]) -> dict[str, dict]:
        """The share request of the target with every peer's keys the coordinator's own; the mask
        request of the target with ciphertexts of the coordinator's making (so that it masks)."""
        from protocol.secagg import primitives as crypto
        from protocol.secagg.protocol import share_associated_data
        from protocol.secagg.shamir import PRIME, share_to_bytes

        self._session(phase, requests)
        if phase == "share" and requests:
            self.target = target = target or sorted(requests)[0]
            if target not in requests or not isinstance(requests[target].get("peers"), dict):
                self.note = f"{target} was not asked to share in this session"
                return requests
            peers = {}
            for peer, info in sorted(requests[target]["peers"].items()):
                c, s = crypto.new_private_key(), crypto.new_private_key()
                self.keys[peer] = (c, s)
                peers[peer] = {**info, "c": crypto.public_bytes(c), "s": crypto.public_bytes(s)}
            return {**requests, target: {**requests[target], "peers": peers}}
        if phase == "mask" and self.context and self.target in requests:
            target, theirs = self.target, requests[self.target].get("ciphertexts") or {}
            made = {}
            for peer in sorted(theirs):
                if peer not in self.keys:
                    made[peer] = theirs[peer]
                    continue
                key = crypto.agree(self.keys[peer][0], self.advertised[target]["c"], b"share", self.nonce)
                plain = (struct.pack(">II", self.index[peer], self.index[target])
                         + share_to_bytes(secrets.randbelow(PRIME)) + share_to_bytes(secrets.randbelow(PRIME))
                         + self.context)
                made[peer] = crypto.encrypt(key, plain, share_associated_data(self.nonce, peer, target))
                self.forged_to.append(peer)
            return {**requests, target: {**requests[target], "ciphertexts": made}}
        return requests

    def equivocate(self, target: str, phase: str, requests: dict[str, dict]) -> dict[str, dict]:
        """Every second site (sorted) whose view lists the target among the survivors is told
        that it dropped instead (the target keeps itself a survivor)."""
        self._session(phase, requests)
        if not requests or not all(isinstance(body.get("survivors"), list) for body in requests.values()):
            return requests
        self.target = target = target or sorted(requests)[0]
        if target not in requests:
            self.note = f"{target} was not among the survivors named in this session"
            return requests
        self.listers = sorted(site for site, body in requests.items()
                              if site != target and target in body["survivors"])
        self.told_dropped = self.listers[::2]
        out = dict(requests)
        for site in self.told_dropped:
            body = requests[site]
            out[site] = {**body, "survivors": [v for v in body["survivors"] if v != target],
                         "dropped": sorted({*body["dropped"], target})}
        return out

    # -- what came back -----------------------------------------------------------------------

    def observe(self, kind: str, phase: str, answers: dict, refused: dict[str, str]) -> None:
        for site, why in sorted(refused.items()):
            self.refused.setdefault(site, f"{phase}: {why.removeprefix('refused: ')}")
        values = {site: value[1] for site, value in answers.items()
                  if isinstance(value, tuple) and len(value) == 2}
        if phase == "advertise":
            self.advertised = {site: keys for site, keys in values.items() if isinstance(keys, dict)}
        elif kind == "substitute_keys" and phase == "share" and self.target in values:
            self._open(values[self.target])
        elif kind == "substitute_keys" and phase == "mask" and self.target in values and self.rebuilt:
            self._read(*values[self.target])
        elif kind == "equivocate_survivors" and phase == "unmask":
            self.unmask_seen = True
            for site, value in values.items():
                if site in self.index and isinstance(value, dict):
                    if self.target in value.get("b", {}):
                        self.b_shares[self.index[site]] = value["b"][self.target]
                    if self.target in value.get("s", {}):
                        self.s_shares[self.index[site]] = value["s"][self.target]

    def _open(self, ciphertexts: dict) -> None:
        """The target's share ciphertexts to the peers whose keys the coordinator made, opened
        (the pair key: the coordinator's c secret with the target's advertised c key), and its
        mask key and self-mask seed rebuilt from them when there are t."""
        from protocol.secagg import primitives as crypto
        from protocol.secagg.protocol import share_associated_data
        from protocol.secagg.shamir import SHARE_BYTES, ShareError, reconstruct_secret, share_from_bytes
        from protocol.secagg.unmasking import seed_bytes

        target = self.target
        for peer, (c, _) in sorted(self.keys.items()):
            if peer not in ciphertexts or target not in self.advertised:
                continue
            key = crypto.agree(c, self.advertised[target]["c"], b"share", self.nonce)
            try:
                plain = crypto.decrypt(key, ciphertexts[peer], share_associated_data(self.nonce, target, peer))
            except crypto.DecryptionError:
                continue
            if len(plain) < 8 + 2 * SHARE_BYTES or struct.unpack(">II", plain[:8])[1] != self.index.get(peer):
                continue
            self.opened[peer] = (share_from_bytes(plain[8:8 + SHARE_BYTES]),
                                 share_from_bytes(plain[8 + SHARE_BYTES:8 + 2 * SHARE_BYTES]))
            self.context = plain[8 + 2 * SHARE_BYTES:]
        if not self.threshold or len(self.opened) < self.threshold:
            return
        try:
            s = reconstruct_secret({self.index[p]: shares[0] for p, shares in self.opened.items()}, self.threshold)
            b = reconstruct_secret({self.index[p]: shares[1] for p, shares in self.opened.items()}, self.threshold)
            mask_key = crypto.private_from_bytes(seed_bytes(s))
        except (ShareError, ValueError):
            return
        self.rebuilt = (mask_key, seed_bytes(b))
        self.key_matches = crypto.public_bytes(mask_key) == self.advertised[target]["s"]

    def _read(self, bits: int, masked) -> None:
        """The target's input: its masked vector less its self mask (the rebuilt seed) and the
        pairwise masks it added against the coordinator's s keys (whose secrets it holds)."""
        from protocol.secagg import primitives as crypto
        from protocol.secagg.protocol import add_mod, sub_mod

        x = np.asarray(masked, dtype=np.uint64)
        x = sub_mod(x, crypto.mask_vector(self.rebuilt[1], x.size, bits), bits)
        target = self.target
        for peer in self.forged_to:
            seed = crypto.agree(self.keys[peer][1], self.advertised[target]["s"], b"mask", self.nonce,
                                self.context)
            mask = crypto.mask_vector(seed, x.size, bits)
            x = sub_mod(x, mask, bits) if self.index[target] < self.index[peer] else add_mod(x, mask, bits)
        self.read = read_vector(x, bits)

    def finding(self, kind: str) -> str:
        caught = self._caught()
        if self.note:
            return self.note
        if kind == "substitute_keys":
            if not self.keys:
                return "the session ended before any share request was sent"
            told = f"{self.target} was sent keys of the coordinator's making for its {len(self.keys)} peers"
            if self.target in self.refused and not self.opened:
                return (f"{told}; it refused: {_short(self.refused[self.target])}"
                        f"{'; the session ended, nothing unmasked' if caught else ''}")
            t = self.threshold
            opened = f"{told} and answered; opened {len(self.opened)} of the target's share ciphertexts"
            if len(self.opened) < t:
                return f"{opened}, fewer than t = {t}"
            text = (f"{opened}: with t = {t} of them the coordinator rebuilds its self mask and mask key and reads "
                    f"its input")
            if self.rebuilt:
                matches = "matches" if self.key_matches else "does NOT match"
                text += f" (rebuilt here: the mask key {matches} the s key {self.target} advertised)"
            if self.read:
                text += (f"; with ciphertexts of the coordinator's making in the mask phase {self.target} masked, and "
                         f"its input reads: {self.read}")
            elif self.target in self.refused:
                text += f"; {self.target} sent no masked input: {_short(self.refused[self.target])}"
            others = sorted(site for site in self.refused if site != self.target)
            if others:
                text += f"; {len(others)} other sites refused, e.g. {others[0]}: {_short(self.refused[others[0]])}"
            return text
        if not self.listers:
            return ("the session ended before any survivors were named"
                    + (f": {_short(self.refused[min(self.refused)])}" if self.refused else ""))
        text = (f"{self.target} was named dropped to {len(self.told_dropped)} of the {len(self.listers)} sites that "
                f"list it ({', '.join(self.told_dropped)}), surviving to the others")
        released = self.unmask_seen and bool(self.b_shares or self.s_shares)  # some unmask answers came
        if released or (self.unmask_seen and not caught):
            t, b, s = self.threshold, len(self.b_shares), len(self.s_shares)
            holders = len(self.listers) + 1
            text += (f"; the unmask answers carried {b} shares of {self.target}'s self-mask seed and {s} of its mask "
                     f"key, t = {t}: ")
            if b >= t and s >= t:
                text += "both reached t: the coordinator can rebuild both and read its input from its masked vector"
            else:
                text += "not both reached t, its input stays hidden" + (
                    f" (its {holders} holders send one share each, {holders} in all, fewer than 2t = {2 * t})"
                    if holders < 2 * t else "")
        if caught:
            site, why = caught
            lying = sum(any(lie in w for lie in _lies()) for w in self.refused.values())
            ended = "the session ended on the lie" if released else "nothing unmasked"
            return f"{text}; {lying} sites refused, {ended}: e.g. {site}: {_short(why)}"
        others = {site: why for site, why in self.refused.items()}
        if others:
            site = min(others)
            text += f"; {len(others)} sites refused, e.g. {site}: {_short(others[site])}"
        return text

    def _caught(self) -> tuple[str, str] | None:
        lying = sorted((site, why) for site, why in self.refused.items() if any(lie in why for lie in _lies()))
        return lying[0] if lying else None


def _lies() -> tuple[str, ...]:
    from protocol.secagg.protocol import LIES

    return LIES


def read_vector(x: np.ndarray, bits: int) -> str:
    """A vector of Z_M in words, its entries read as signed (what a noisy histogram holds): a
    one-hot vector named by its bin; a vector of small entries by its nonzero ones; anything else
    (the masks did not come off) as such."""
    half = 1 << (bits - 1)
    signed = [int(v) - (1 << bits) if int(v) >= half else int(v) for v in x]
    nonzero = [(i, v) for i, v in enumerate(signed) if v]
    if len(nonzero) == 1 and nonzero[0][1] == 1:
        return f"a one-hot vector, bin {nonzero[0][0]} of {len(signed)}"
    if max((abs(v) for v in signed), default=0) < 1 << max(1, bits // 2):
        shown = ", ".join(f"{i}: {v}" for i, v in nonzero[:8])
        return f"{len(signed)} entries, {len(nonzero)} nonzero ({shown}{', ...' if len(nonzero) > 8 else ''})"
    return f"{len(signed)} entries that look uniform on Z_M (the masks did not come off)"


def fabricated_limits(limits: list[float], bins: int) -> list[float]:
    """A table of `bins` equal bins over the finite span of `limits` (or [-10, 10]), keeping
    every real limit so that the releases still fold into the coordinator's table."""
    finite = [v for v in limits if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if len(finite) >= 2 else (-10.0, 10.0)
    grid = np.linspace(lo, hi, bins + 1)
    return sorted({float(v) for v in grid} | {float(v) for v in limits})


def equivocated(body: dict, factor: float) -> tuple[dict, str]:
    """`body` asking `factor` times the bins (a secure sum's advertise: the method's bins and the
    vector length with them), and what changed in words ("" when the body has no bins)."""
    summed = isinstance(body.get("method"), dict)
    inner = body["method"] if summed else body
    bins = inner.get("bins")
    if not isinstance(bins, dict) or isinstance(bins.get("count"), bool) or not isinstance(bins.get("count"), int):
        return body, ""
    count = bins["count"]
    more = max(count + 1, int(round(count * factor)))
    hierarchical = inner.get("histogram") == "hierarchical"
    if hierarchical:
        more = 1 << (more - 1).bit_length()  # a tree's bins are a power of two
    inner = {**inner, "bins": {**bins, "count": more}}
    change = f"for {more} bins where every other site was asked for {count}"
    if not summed:
        return inner, change
    out = {**body, "method": inner}
    params = body.get("params")
    if isinstance(params, dict) and isinstance(params.get("length"), int):
        out["params"] = {**params, "length": 2 * more - 2 if hierarchical else more}
    return out, change


def inflated(body: dict, factor: float) -> dict:
    """A request whose central claim says `factor` times the messages (or inputs) it has, with
    the smaller epsilon that many would back, so that a site taking the word would book less."""
    from stats.amplification import shuffled_epsilon

    if isinstance(body.get("central"), dict) and "messages" in body["central"]:
        central = dict(body["central"])
        central["messages"] = int(central["messages"] * factor)
        central["epsilon"] = shuffled_epsilon(float(body["epsilon"]), central["messages"], central["delta"]) * (1 + 1e-9)
        return {**body, "central": central}
    method = body.get("method")
    if isinstance(method, dict) and isinstance(method.get("central"), dict):
        return {**body, "method": inflated_public(method, factor)}
    return body


def inflated_public(public: dict, factor: float) -> dict:
    central = dict(public["central"])
    if "messages" in central:
        return inflated(public, factor)
    from stats.ddg import histogram_epsilon

    central["inputs"] = int(central["inputs"] * factor)
    central["epsilon"] = histogram_epsilon(public["c"], central["inputs"], float(public["sigma2"]),
                                           public["bins"]["count"], public["histogram"] == "hierarchical",
                                           float(central["delta"]), central["accounting"]) * (1 + 1e-9)
    return {**public, "central": central}


def _short(reason: str) -> str:
    return reason if len(reason) <= 200 else reason[:197] + "..."
