"""Noise flags for recorded decisions: is this text a decision at all?

Agents record status updates as decisions ("Done", "Sent the email", "Merged PR #42"). Such a
record has no alternative that could have gone wrong, so its outcome says nothing about the
agent's judgement, and counting it would push calibration towards "always right". The flag
``not_a_decision`` keeps it out of calibration (unless it is reviewed anyway); it never
rejects the record.

The check runs on every recordDecision, so it is a pure function over the text: a few regular
expressions, no model, no network, no state, and the same answer for the same input.

Why the rules are what they are:

- **A wrong flag costs more than a missed one.** A real decision wrongly flagged silently
  leaves calibration; a status update that slips through is what happens today. So any sign
  of a choice vetoes the flag: the choice verbs (use, choose, adopt, prefer, keep, replace,
  switch to, ...), alternatives and comparison (instead of, rather than, over, vs, than,
  faster, ...), commitments (will, never, only, until, unless, must, ...) and justification
  (because, so that, to avoid, ...), the means of a fix ("by caching") and interim choices
  ("as a stopgap", "for now"). The veto is deliberately broad: it costs recall on status
  updates that happen to use these words ("Updated the docs to say we use Postgres"), which is
  the cheap side of the trade.
- **Status is recognised by its shape, not by topic.** A decision can be about anything, so
  there is no list of "trivial topics" beyond the housekeeping objects of commit messages
  (typo, changelog, version, lint, imports). What marks a status update is how it is said:
  an acknowledgement ("Ok, thanks", "Will do"); a clause that opens with a past-tense verb
  of doing a task ("Sent", "Fixed", "Deployed", "Ran"; the past-tense verbs of choosing such
  as "chose", "switched", "dropped" or "limited" are not in that list); a short clause whose
  predicate is a completion ("Migration complete", "PR #42 merged", "Tests pass", "Queue is
  drained"); a progress or waiting note ("Working on it", "Blocked on ..."); a report
  heading ("Progress:", "Results:"). Every clause (split at , ; : . and "and") must be
  status, acknowledgement or neutral, and the first must be status or acknowledgement: a text
  that opens by stating what it does ("Merge now, fix the docs later") is not flagged.
- **Acknowledgements are exempt from the veto.** "Thanks, will look" holds "will" but
  commits to nothing among alternatives; the acknowledgement phrases are matched as whole
  clauses, so "will use Kafka" is still a commitment.
- **An open question is not a decision yet.** "Need to decide between A and B" or
  "Investigating whether to use A" names alternatives without choosing, so that clause is
  exempt from the veto; a later clause that does choose ("..., went with A") still vetoes.
- **Reasons make a flag less likely.** An agent that attached reasons probably weighed
  something; with reasons only a short text made entirely of status or acknowledgement
  clauses is flagged ("Done" with a token reason is still noise).
- **Context can reveal the alternatives.** A terse answer ("Option 2", "Kafka.") is a
  decision when the context lists the options; choice words in the context veto the flag.
- **Long texts are not status updates.** A status update is a line; a text longer than
  ``MAX_TEXT_CHARS`` is never flagged and never scanned, and a context is scanned only when
  the text would be flagged and only up to ``MAX_CONTEXT_CHARS`` (longer: no flag). So the cost
  of the check is bounded by those two constants, not by what a caller sends.

The rules were measured on a hand-written labelled set (tests/data/quality/labelled.yaml,
``python -m bench.quality_flags``); docs/QUALITY_FLAGS.md keeps the figures.
"""

from __future__ import annotations

import re
from typing import Final

NOT_A_DECISION: Final = "not_a_decision"

# A status update is a line: a longer text is left unflagged unread, which also bounds the cost
# of the check whatever the caller sends (texts may be up to app.wire.TEXT_MAX).
MAX_TEXT_CHARS: Final = 280
# The context is read for alternatives only when the text would be flagged, and only this much
# of it: a longer context is taken as deliberation (unread text could name the alternatives).
MAX_CONTEXT_CHARS: Final = 1000
# A clause with reasons attached is flagged only up to this many words (see the docstring).
MAX_WORDS_WITH_REASONS: Final = 6
# A clause without a leading task verb counts as a completion only up to this many words:
# "Migration complete" is a report, a long sentence that ends in "done" usually is not.
MAX_WORDS_PREDICATE: Final = 8


def _words(*items: str) -> str:
    return "|".join(items)


# Signs of a choice: any of them anywhere in the text (or the context) vetoes the flag.
_CHOICE = re.compile(
    r"\b(?:"
    + _words(
        # choosing, in every tense
        r"us(?:e|es|ed|ing)",
        r"cho(?:ose|oses|se|sen|osing|ice)",
        r"adopt\w*",
        r"prefer\w*",
        r"(?<!-)pick(?:s|ed|ing)?(?! up\b)",
        r"select\w*",
        r"opt(?:s|ed|ing)?",
        r"(?:go|goes|going|went|gone) (?:with|for)",
        r"decid\w*",
        r"decision",
        r"switch(?:es|ed|ing)? (?:to|from|over)",
        r"replac\w*",
        r"migrat\w* (?:to|from|off)",
        r"keep\w*",
        r"kept",
        r"stay\w*",
        r"stick\w* with",
        r"drop\w*",
        r"reject\w*",
        r"defer\w*",
        r"postpon\w*",
        r"settl\w*",
        r"agre\w*",
        r"accept\w*",
        r"avoid\w*",
        r"requir\w*",
        r"enforc\w*",
        r"standardi[sz]\w*",
        r"forbid\w*",
        r"disallow\w*",
        r"deny",
        r"hold",
        r"leave",
        r"let",
        r"skip\w*",
        r"revert\w* to",
        r"limit\w*",
        r"cap(?:s|ped)?",
        r"disabl\w*",
        r"instead",
        r"rather",
        # "over" compares, except in handovers and time phrases ("over the weekend")
        r"(?<!handed )(?<!took )(?<!hand )over"
        r"(?! (?:the |a )?(?:weekend|night|holidays?|lunch|break))",
        r"vs",
        r"versus",
        r"than",
        r"in favou?r of",
        r"alternative\w*",
        r"option\w*",
        r"trade-?off\w*",
        r"(?:better|worse|faster|slower|cheaper|simpler|safer|easier|harder|smaller|larger)",
        r"not",
        r"never",
        r"always",
        r"only",
        r"until",
        r"unless",
        r"will",
        r"won't",
        r"we'll",
        r"shall",
        r"should",
        r"must",
        r"going to",
        r"let's",
        r"from now on",
        r"do not",
        r"don't",
        r"because",
        r"since",
        r"so (?:that|we|it|the|they|all)",
        r"to (?:avoid|prevent|stop|block|keep|reduce|cut|allow|ensure|support|simplify|save|"
        r"speed|make|free|unblock|mitigate|work around|improve|isolate|decouple|protect|"
        r"comply|meet|lower|limit|cover|catch|spare|shorten|harden)",
        # an interim choice: a stopgap is picked over the real fix
        r"stopgaps?",
        r"workarounds?",
        r"temporar\w*",
        r"interim",
        r"for now",
        r"in order to",
        # "by caching", "by eager-loading": the means picked among others
        r"by [\w-]+ing",
        r"given",
        r"due to",
        r"otherwise",
        r"worth",
    )
    + r")\b"
)

# Whole clauses that acknowledge or answer without choosing.
_ACK = re.compile(
    r"^(?:"
    + _words(
        r"ok(?:ay)?",
        r"k",
        r"done",
        r"ack(?:nowledged)?",
        r"noted",
        r"lgtm",
        r"approved",
        r"thanks?(?: you)?",
        r"thx",
        r"yes",
        r"yep",
        r"sure",
        r"roger",
        r"fine",
        r"great",
        r"got it",
        r"sounds good",
        r"will do",
        r"on it",
        # promises to do a chore of communication or checking: not a choice of approach
        r"(?:i |we )?will (?:look|check|do|follow up|get back|report|send|reply|ping|"
        r"email|share|post|review)\b.*",
        r"nothing to do",
        r"no action needed",
        r"no changes?",
        r"\+1",
    )
    + r")(?:\s+(?:ok(?:ay)?|thanks?|will do|on it|done))*$"
)

# Clause openers before the verb that do not change what the clause is.
_FILLER = re.compile(
    r"^(?:(?:i|we|agent|just|have|has|had|now|also|then|finally|successfully|already)\s+)+"
)

# Past-tense verbs of doing a task (not of choosing one way over another).
_TASK_VERB = re.compile(
    r"^(?:"
    + _words(
        "added",
        "analy[sz]ed",
        "answered",
        "applied",
        "asked",
        "attached",
        "audited",
        "benchmarked",
        "backed up",
        "built",
        "checked in",
        "cherry-picked",
        "bumped",
        "checked",
        "cleaned(?: up)?",
        "cleared",
        "collected",
        "compiled",
        "closed",
        "committed",
        "commented(?: on)?",
        "compared",
        "completed",
        "configured",
        "contacted",
        "converted",
        "confirmed",
        "copied",
        "created",
        "debugged",
        "diagnosed",
        "discovered",
        "deleted",
        "deployed",
        "documented",
        "done",
        "downloaded",
        "drafted",
        "emailed",
        "exported",
        "filed",
        "flushed",
        "found",
        "gathered",
        "generated",
        "finished",
        "fixed",
        "formatted",
        "got",
        "handed over",
        "imported",
        "implemented",
        "installed",
        "investigated",
        "invited",
        "identified",
        "inspected",
        "killed",
        "labell?ed",
        "logged",
        "looked",
        "merged",
        "measured",
        "messaged",
        "met with",
        "monitored",
        "notified",
        "noticed",
        "observed",
        "opened",
        "paused",
        "pinged",
        "posted",
        "profiled",
        "provisioned",
        "published",
        "pulled",
        "pushed",
        "purged",
        "ran",
        "re-?ran",
        "re-?enabled",
        "read",
        "rebased",
        "rebuilt",
        "rebooted",
        "recorded",
        "redeployed",
        "received",
        "refactored",
        "refreshed",
        "regenerated",
        "reindexed",
        "released",
        "removed",
        "renamed",
        "replied",
        "reported",
        "reproduced",
        "resolved",
        "responded",
        "restarted",
        "restored",
        "retried",
        "rolled out",
        "reviewed",
        "rotated",
        "scheduled",
        "sent",
        "set up",
        "shared",
        "spoke",
        "spun up",
        "summari[sz]ed",
        "shipped",
        "started",
        "submitted",
        "synced",
        "talked",
        "tore down",
        "traced",
        "tagged",
        "tested",
        "tidied(?: up)?",
        "triaged",
        "tried",
        "updated",
        "uploaded",
        "verified",
        "went through",
        "wrote",
        "wiped",
        "picked up",
    )
    + r")\b"
)

# Commit-message style: an imperative housekeeping verb on a housekeeping object.
_CHORE = re.compile(
    r"^(?:fix|update|bump|add|remove|clean up|format|rename|tidy|sort)\b"
    r"(?:\s+\S+){0,2}?\s+(?:typos?|changelog|readme|version|lint|formatting|whitespace|"
    r"comments?|docstrings?|imports?|lockfile|spelling|dependencies|deps|requirements)\b"
)

# Predicates of completion, progress or waiting, for short clauses with no task verb first.
_PREDICATE = re.compile(
    r"\b(?:"
    + _words(
        "done",
        "complete",
        "completed",
        "finished",
        "merged",
        "measured",
        "messaged",
        "met with",
        "monitored",
        "deployed",
        "sent",
        "shipped",
        "released",
        "fixed",
        "resolved",
        "responded",
        "pass(?:es|ed|ing)?",
        "green",
        "red",
        "failed",
        "failing",
        "succeeded",
        "drained",
        r"(?:is|are|was|were|been) \w+ed",
        "in progress",
        "working on",
        "waiting (?:on|for)",
        "blocked (?:on|by)",
        "looking into",
        "progress",
        "moved to",
        # headline style: "Review requested", "Results attached"
        "(?:requested|attached|scheduled|queued|started|paused|resumed|opened|closed|approved|"
        "uploaded|created)$",
        "healthy",
        "back to normal",
        "recovered",
        "(?:is|are) (?:up|down|stable)",
    )
    + r")\b"
)

# Progress notes: a clause that opens with what is under way.
_PROGRESS = re.compile(
    r"^(?:still\s+)?(?:working on|waiting (?:on|for)|blocked (?:on|by)|looking into|"
    r"fixing|checking|investigating|running|deploying)\b"
)

# A heading of a report: "Progress: ...", "Results: ...", "Root cause: ...".
_HEADING = re.compile(
    r"^(?:[\w -]{0,20}\s)?(?:progress|status|update|results?|root cause|fyi|eta)\s*:"
)

# An open question: names alternatives without choosing one.
_UNDECIDED = re.compile(
    r"^(?:still\s+)?(?:(?:need|needs) to (?:decide|choose|pick)|deciding|"
    r"investigating whether|evaluating whether|considering whether|not yet decided|not sure|"
    r"unsure|undecided|tbd)\b"
)

_VETO_EXEMPT: Final = ("ack", "open")

_CLAUSE_SPLIT = re.compile(r"\s*(?:[,;:!?]|\.(?=\s|$)|\s-\s|\s—\s|\band\b)\s*")
_WORD = re.compile(r"[\w'#%+.-]+")


def _normalise(text: str) -> str:
    text = text.replace("’", "'").replace("‘", "'").lower()
    return " ".join(text.split())


def _clause_kind(clause: str) -> str:
    """``ack``, ``open`` (an open question), ``status`` or ``neutral`` for one clause."""
    if _ACK.match(clause):
        return "ack"
    core = _FILLER.sub("", clause)
    if _UNDECIDED.match(core):
        return "open"
    if _TASK_VERB.match(core) or _CHORE.match(core) or _PROGRESS.match(core):
        return "status"
    if len(_WORD.findall(core)) <= MAX_WORDS_PREDICATE and _PREDICATE.search(core):
        return "status"
    return "neutral"


def flags(decision: str, *, reasons: int = 0, context: str | None = None) -> list[str]:
    """The quality flags of a decision's text: ``["not_a_decision"]`` or ``[]``.

    ``reasons`` is how many reasons the agent attached; ``context`` its context text, if any.
    Deterministic and offline (see the module docstring for why each rule is there)."""
    if len(decision) > MAX_TEXT_CHARS:
        return []
    text = _normalise(decision)
    if not text:
        return []
    heading = _HEADING.match(text) is not None
    clauses = [c for c in _CLAUSE_SPLIT.split(text.strip(" .!")) if c]
    if not clauses:
        return []
    kinds = [_clause_kind(c) for c in clauses]
    # Acknowledgements are whole stock phrases and an open question names the alternatives it
    # has not chosen between; a choice word in any other clause vetoes.
    if any(
        k not in _VETO_EXEMPT and _CHOICE.search(c) for c, k in zip(clauses, kinds, strict=True)
    ):
        return []
    if not (heading or kinds[0] in _VETO_EXEMPT or kinds[0] == "status"):
        return []
    if reasons > 0 and (
        heading or "neutral" in kinds or len(_WORD.findall(text)) > MAX_WORDS_WITH_REASONS
    ):
        return []
    if context and (len(context) > MAX_CONTEXT_CHARS or _CHOICE.search(_normalise(context))):
        return []
    return [NOT_A_DECISION]
