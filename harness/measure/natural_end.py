"""Where each answer ends by itself, next to the decode window's forced length.

The window asks every stream for exactly N tokens (`ignore_eos`). Past the point where the model
would have stopped, it goes on with whatever follows its end-of-turn token: a made-up new turn,
or a loop. Decoding there costs the same work per token, so plain decode speed is unaffected. But
speculative decoding's acceptance depends on what is generated: a tail that repeats itself is
drafted almost perfectly and flatters tok/s (a repetition loop is the fastest arm of a speculative
benchmark), and a tail of noise can understate it. So when the server's speculative counters moved
in the measured runs, one more run sends the same workload without `ignore_eos`: each answer's own
length, and the acceptance on the model's own answers, reported beside the window's
(docs/measurement.md, "Past the model's own end").
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.measure.sample import RunSample

# The prompts of this run are drawn under their own variant: no measured run or warm-up sent them.
NATURAL_REPEAT = 6_000
MIN_DRAFT_TOKENS = 10  # fewer drafted tokens than this in a run: its acceptance says little
# Acceptances that differ by more than this, relatively and absolutely, are worth a warning.
REL_GAP = 0.2
ABS_GAP = 0.1
MARK = "past the answers' own ends"  # in every note: how a reader of warnings finds them


def speculating(samples: Sequence[RunSample]) -> bool:
    """The server drafted tokens in a counted run: speculative decoding is on and running."""
    return any(s.server.get("spec_draft_tokens", 0.0) > 0 for s in samples if not s.excluded)


def acceptance(samples: Sequence[RunSample]) -> tuple[float | None, float]:
    """(accepted / drafted tokens over these runs, drafted tokens); None below MIN_DRAFT_TOKENS."""
    drafted = sum(s.server.get("spec_draft_tokens", 0.0) for s in samples)
    accepted = sum(s.server.get("spec_accepted_tokens", 0.0) for s in samples)
    return (accepted / drafted if drafted >= MIN_DRAFT_TOKENS else None), drafted


@dataclass(frozen=True)
class NaturalEnd:
    tokens: dict[str, int]  # item (or stream) -> output tokens where the answer ended by itself
    asked: dict[str, int]  # item -> the window's max_tokens
    acceptance_natural: float | None  # speculative acceptance on the model's own answers
    acceptance_window: float | None  # the same over the measured (forced-length) runs
    drafted_natural: float

    @property
    def past_end_share(self) -> float:
        """Share of the window's asked tokens that lie past the answers' own ends."""
        asked = sum(self.asked.values())
        past = sum(max(0, n - self.tokens.get(k, n)) for k, n in self.asked.items())
        return past / asked if asked else 0.0

    def note(self) -> str | None:
        """A warning when the forced tail makes speculation look better or worse than the model's own
        answers do; None when they agree or cannot be compared."""
        win, nat = self.acceptance_window, self.acceptance_natural
        # A window that hardly drafted has nothing for its tail to flatter; no tail, nothing to blame.
        if win is None or self.past_end_share < 0.05:
            return None
        ends = ", ".join(f"{k} {self.tokens[k]} of {n}" for k, n in self.asked.items() if self.tokens.get(k, n) < n)
        past = f"{100 * self.past_end_share:.0f}% of the window's tokens lie {MARK} ({ends})"
        if nat is None and self.drafted_natural == 0:
            return (f"{past}; speculative decoding drafted in the window but never in the model's own answers: its "
                    "effect here comes from the forced tail, not from the workload's answers")
        if nat is None:
            return (f"{past}; too few drafted tokens ({self.drafted_natural:.0f}) in the model's own answers to tell "
                    "whether the tail flatters speculative decoding")
        close = abs(win - nat) < ABS_GAP or (nat > 0 and abs(win / nat - 1) < REL_GAP)
        if close:
            return None
        how = "flatters" if win > nat else "understates"
        return (f"speculative acceptance {100 * win:.0f}% in the window, {100 * nat:.0f}% on the model's own "
                f"answers: {past}, so the window {how} this config for real traffic")

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "asked": self.asked, "past_end_share": round(self.past_end_share, 4),
                "acceptance_natural": self.acceptance_natural, "acceptance_window": self.acceptance_window,
                "drafted_natural": self.drafted_natural}


def natural_end(run: RunSample, counted: Sequence[RunSample]) -> NaturalEnd:
    """Summarize the run without ignore_eos against the counted (forced-length) runs."""
    tokens: dict[str, list[int]] = {}
    asked: dict[str, int] = {}
    for i, r in enumerate(run.requests):
        if not r.ok or r.output_tokens is None:
            continue
        key = r.item or f"stream {i}"
        tokens.setdefault(key, []).append(r.output_tokens)
        if r.max_tokens:
            asked[key] = r.max_tokens
    own = {k: int(statistics.median(v)) for k, v in tokens.items()}
    nat, drafted = acceptance([run])
    win, _ = acceptance(counted)
    return NaturalEnd(own, {k: asked.get(k, own[k]) for k in own}, nat, win, drafted)
