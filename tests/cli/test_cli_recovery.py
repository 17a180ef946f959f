"""``agent-learn dlq replay --reason/--dry-run`` and ``agent-learn rescore`` on the embedded store
and queue, through the CLI as an operator runs them (:mod:`agent_learning.ops.recovery` underneath)."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rich")

from cli_harness import clear_settings, cli
from factories import make_unjudged

from agent_learning.app.embedded import LocalPipeline, open_local
from agent_learning.app.settings import load_settings
from agent_learning.core.clock import ManualClock
from agent_learning.judges.sampling import id_fraction
from agent_learning.ops.audit import audit_agent
from agent_learning.ops.recovery import REPLAY_LIMIT, replay_dead_letters, rescore
from agent_learning.pipeline import create_policy, load_current
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.queue.base import OutgoingMessage
from agent_learning.sim.simulate import math_tutor

AGENT = "math-tutor"


def as_json(*args: str, code: int = 0) -> Any:
    result = cli(*args, "--json")
    assert result.exit_code == code, (args, result.output)
    return json.loads(result.stdout)


@pytest.fixture
def pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalPipeline]:
    clear_settings(monkeypatch)
    monkeypatch.setenv("AGENT_LEARNING_SQLITE_PATH", str(tmp_path / "local.db"))
    # Rescores and rollbacks of a few episodes: too few for the guardrail to judge (it would hold them); it warns.
    monkeypatch.setenv("AGENT_LEARNING_GUARDRAIL", "warn")
    p = open_local(load_settings(), clock=ManualClock())
    scenario = math_tutor(AGENT)
    create_policy(p.store, SoftmaxPolicy.from_actions(AGENT, scenario.actions).to_document(created_at=p.clock.now()))
    yield p
    p.store.close()
    p.queue.close()


def episodes(p: LocalPipeline, n: int, seed: int = 1) -> list[str]:
    scenario, rng = math_tutor(AGENT), random.Random(seed)
    policy = SoftmaxPolicy.from_document(load_current(p.store, AGENT), rng=rng)  # type: ignore[arg-type]
    return [scenario.run_episode(p.store, policy.choose(), rng, p.clock).id for _ in range(n)]


def dead_letter(p: LocalPipeline, ids: list[str], body: dict[str, Any] | None = None) -> None:
    p.queue.send([OutgoingMessage(i, json.dumps(body or {"episode_id": i})) for i in ids])
    assert p.score_pending()["dead_letter"] == len(ids)


def test_dlq_replay_by_reason_with_a_dry_run_first(pipeline: LocalPipeline) -> None:
    dead_letter(pipeline, ["ghost-1", "ghost-2"])  # EpisodeNotFound
    dead_letter(pipeline, ["bad-1"], {"type": "score_request"})  # InvalidMessage: no episode id
    reasons = sorted(d["reason"] for d in as_json("dlq", "list"))
    assert reasons == ["EpisodeNotFound", "EpisodeNotFound", "InvalidMessage"]

    preview = as_json("dlq", "replay", "--reason", "EpisodeNotFound", "--dry-run")
    assert preview == {"would_replay": 2, "message_ids": ["ghost-1", "ghost-2"], "left": {"InvalidMessage": 1}}
    assert len(as_json("dlq", "list")) == 3  # nothing changed
    dry = cli("dlq", "replay", "--reason", "EpisodeNotFound", "--dry-run")
    assert "would replay 2" in dry.stdout and "ghost-1" in dry.stdout and "1 InvalidMessage" in dry.stdout
    assert "replaying" not in dry.stderr  # a dry run replays nothing, nor says it does

    done = as_json("dlq", "replay", "--reason", "EpisodeNotFound", "--reason", "NoSuchReason")
    assert done == {"replayed": 2, "message_ids": ["ghost-1", "ghost-2"], "left": {"InvalidMessage": 1}}
    assert [d["message_id"] for d in as_json("dlq", "list")] == ["bad-1"]
    assert pipeline.queue.counts().active == 2

    both = as_json("dlq", "replay", "--reason", "InvalidMessage", "--id", "ghost-1")  # must match both
    assert both == {"replayed": 0, "message_ids": [], "left": {"InvalidMessage": 1}}
    refused = cli("dlq", "replay", "--all", "--reason", "InvalidMessage")
    assert refused.exit_code == 2 and "--reason" in refused.stderr


def test_a_replay_reports_how_many_dead_letters_the_queue_moved_not_how_many_it_chose(pipeline: LocalPipeline) -> None:
    """Another operator's replay between reading the dead letters and moving them: the ids chosen
    were 2, the queue moved none, and "replayed 2" said otherwise."""
    dead_letter(pipeline, ["ghost-1", "ghost-2"])
    inner = pipeline.queue

    class Raced:
        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        def dead_letters(self, limit: int = 100) -> Any:
            letters = inner.dead_letters(limit)
            inner.replay_dead_letters(None)  # the other replay, first
            return letters

    result = replay_dead_letters(Raced(), reasons=["EpisodeNotFound"])  # type: ignore[arg-type]
    assert result.replayed == ["ghost-1", "ghost-2"] and result.moved == 0
    assert replay_dead_letters(inner, dry_run=True).moved is None


def test_dlq_replay_by_id_replays_those_found_and_exits_1_naming_the_others(pipeline: LocalPipeline) -> None:
    dead_letter(pipeline, ["ghost-1"])  # EpisodeNotFound
    dead_letter(pipeline, ["bad-1"], {"type": "score_request"})  # InvalidMessage: no episode id
    preview = cli("dlq", "replay", "--id", "bad-1", "--id", "nosuch", "--dry-run", "--json")
    assert preview.exit_code == 1 and "--id: no dead letter has the id nosuch" in preview.stderr
    assert json.loads(preview.stdout) == {"would_replay": 1, "message_ids": ["bad-1"], "left": {"EpisodeNotFound": 1},
                                          "not_found": ["nosuch"]}
    done = cli("dlq", "replay", "--id", "bad-1", "--id", "nosuch", "--json")
    assert done.exit_code == 1 and json.loads(done.stdout) == {
        "replayed": 1, "message_ids": ["bad-1"], "left": {"EpisodeNotFound": 1}, "not_found": ["nosuch"]}
    text = cli("dlq", "replay", "--id", "ghost-1", "--id", "nosuch")
    assert text.exit_code == 1 and "replayed 1 dead letter" in text.stdout
    assert text.stderr.strip().splitlines()[-1] == (
        "error: --id: no dead letter has the id nosuch (agent-learn dlq list shows them)")
    alone = cli("dlq", "replay", "--id", "nope")
    assert alone.exit_code == 2 and "replayed 0 dead letters" in alone.stdout
    assert alone.stderr.strip().splitlines()[-1].startswith("error: --id: no dead letter has the id nope")


def test_dlq_replay_says_when_dead_letters_past_those_it_reads_were_not_considered(pipeline: LocalPipeline) -> None:
    """A long outage leaves more dead letters than a replay reads: it says so, rather than report
    the first part as all of them, or an id past them as one no dead letter has."""
    n = REPLAY_LIMIT + 2
    pipeline.queue.send([OutgoingMessage(f"e{i:06d}", json.dumps({"episode_id": f"e{i:06d}"})) for i in range(n)])
    while batch := pipeline.queue.receive(500):
        for message in batch:
            pipeline.queue.dead_letter(message, "JudgeFailed")
    last = f"e{n - 1:06d}"
    missed = cli("dlq", "replay", "--id", last, "--dry-run")
    assert missed.exit_code == 2 and "none of the oldest 10,000 dead letters, the ones read" in missed.stderr
    assert "only the oldest 10,000 dead letters were read" in cli("dlq", "replay", "--all", "--dry-run").stdout
    first = as_json("dlq", "replay", "--reason", "JudgeFailed")
    assert (first["replayed"], first["more"]) == (REPLAY_LIMIT, True)
    rest = as_json("dlq", "replay", "--id", last)  # running it again reads past those replayed
    assert rest == {"replayed": 1, "message_ids": [last], "left": {"JudgeFailed": 1}, "not_found": []}  # no "more"


def test_dlq_list_says_when_more_dead_letters_remain_than_it_lists(pipeline: LocalPipeline) -> None:
    """Before the fix `--limit 2` of three dead letters was titled "2 dead letters", as if all."""
    dead_letter(pipeline, ["ghost-1", "ghost-2", "ghost-3"])
    title = " ".join(cli("dlq", "list", "--limit", "2").stdout.split())
    assert title.startswith(
        "the oldest 2 dead letters in score-episodes and train-agents (more remain: --limit N lists more)")
    assert " ".join(cli("dlq", "list", "--limit", "3").stdout.split()).startswith("3 dead letters in score-episodes ")
    assert [d["message_id"] for d in as_json("dlq", "list", "--limit", "2")] == ["ghost-1", "ghost-2"]


def test_dlq_list_json_gives_times_in_iso_8601_utc(pipeline: LocalPipeline) -> None:
    dead_letter(pipeline, ["ghost-1"])
    (dead,) = as_json("dlq", "list")
    at = datetime.fromisoformat(dead["dead_lettered_at"])
    assert dead["dead_lettered_at"].endswith("Z") and at.timestamp() == pytest.approx(pipeline.clock.time())


def test_rescore_reports_trained_pending_and_failed_episodes(pipeline: LocalPipeline) -> None:
    trained = episodes(pipeline, 6)
    pipeline.run_once()
    pending = episodes(pipeline, 3, seed=2)
    pipeline.pump()
    pipeline.score_pending()
    before = load_current(pipeline.store, AGENT)
    assert before is not None and before.version == 2

    result = as_json("rescore", "--agent-id", AGENT)
    assert sorted(result["already_trained"]) == sorted(trained)
    assert sorted(result["pending"]) == sorted(pending)
    assert result["failed"] == []
    assert load_current(pipeline.store, AGENT) == before  # re-scoring publishes nothing

    some = as_json("rescore", "--agent-id", AGENT, "--episode-id", pending[0], "--episode-id", "nope", "--rejudge",
                   code=1)
    assert some["pending"] == [pending[0]] and some["already_trained"] == []
    assert [(f["episode_id"], f["reason"]) for f in some["failed"]] == [("nope", "NotScored")]
    assert some["failed"][0]["description"] == "'nope': no episode has this id"  # a mistyped id, not a missing score
    text = cli("rescore", "--agent-id", AGENT, "--episode-id", trained[0]).stdout
    assert "re-scored 1 episode of" in text
    assert f"already trained (1; recorded, not learned again): {trained[0]}" in text

    many = cli("rescore", "--agent-id", AGENT).stdout  # 9 ids are listed; beyond 10, how many more
    assert all(e in many for e in trained + pending) and "more (--json lists them all)" not in many

    unknown = cli("rescore", "--agent-id", "nobody")
    assert unknown.exit_code == 2 and "nobody" in unknown.stderr
    assert [o.status for o in pipeline.train()] == ["published"]  # the pending episodes, learned once


def test_a_rollback_after_a_rescore_undoes_the_update_and_learns_no_episode_again(pipeline: LocalPipeline) -> None:
    """As recovery.py and Reliability say: a rollback keeps the cursor, so the re-scored episodes
    a version learned from are not learned again, with their new score or otherwise."""
    trained = episodes(pipeline, 8)
    pipeline.run_once()
    assert sorted(as_json("rescore", "--agent-id", AGENT)["already_trained"]) == sorted(trained)
    assert as_json("policy", "rollback", "--agent-id", AGENT, "1")["policy"]["logits"] == [0.0] * 4
    assert as_json("train")["training"][0]["status"] == "no_new_scores"
    books = as_json("audit")["agents"][AGENT]
    assert (books["learned"], books["learned_twice"], books["pending"]) == (8, 0, 0)


def test_a_rollback_is_shown_with_the_version_it_restored_its_note_and_the_pin_it_keeps(
    pipeline: LocalPipeline,
) -> None:
    """Before the fix `policy show` said only "v3 (rollback)" (the version restored and the operator's
    note were in `policy history --json` alone), and a rollback of a pinned agent did not say that
    learning stays paused."""
    episodes(pipeline, 6)
    pipeline.run_once()
    cli("policy", "rollback", "--agent-id", AGENT, "1", "--note", "v2 [answers] too long")
    shown = cli("policy", "show", "--agent-id", AGENT).stdout
    assert shown.splitlines()[0].strip() == f"{AGENT} v3 (rollback of v1)"
    assert "note: rollback from v2 to v1: v2 [answers] too long\n" in shown
    cli("policy", "pin", "--agent-id", AGENT, "--reason", "checking")
    pinned = cli("policy", "show", "--agent-id", AGENT).stdout
    assert pinned.splitlines()[0].strip() == f"{AGENT} v3 (rollback of v1, pinned)"
    kept = " ".join(cli("policy", "rollback", "--agent-id", AGENT, "2").stdout.split())  # a pin outlasts a rollback
    assert kept == f"{AGENT} is now v4, a copy of v2; learning stays paused (agent-learn policy unpin resumes it)"
    cli("policy", "rollback", "--agent-id", AGENT, "1")
    episodes(pipeline, 6, seed=2)
    cli("policy", "unpin", "--agent-id", AGENT)
    pipeline.run_once()
    trained = cli("policy", "show", "--agent-id", AGENT).stdout
    assert trained.splitlines()[0].strip() == f"{AGENT} v6 (train)" and "note:" not in trained  # the run says it


def test_rescore_reports_a_lost_episode_as_lost_not_as_already_trained(pipeline: LocalPipeline) -> None:
    """A score that landed inside a range a run had already read (a late write on Cosmos DB) was
    never learned: a re-score records its new score and says so, as the audit does."""
    trained = episodes(pipeline, 6)
    pipeline.pump()
    pipeline.score_pending()
    with closing(sqlite3.connect(pipeline.store.path, isolation_level=None)) as conn:  # type: ignore[attr-defined]
        conn.execute("UPDATE scores SET seq = -seq")  # room between the seqs (unique at every row's update)
        conn.execute("UPDATE scores SET seq = -seq * 10")
    assert [o.status for o in pipeline.train()] == ["published"]
    (late,) = episodes(pipeline, 1, seed=2)
    pipeline.pump()
    pipeline.score_pending()
    with closing(sqlite3.connect(pipeline.store.path, isolation_level=None)) as conn:  # type: ignore[attr-defined]
        conn.execute("UPDATE scores SET seq = 15, doc = json_set(doc, '$.seq', 15, '$.late_write', json('true'))"
                     " WHERE id = ?", (late,))  # as Cosmos DB marks it
    assert audit_agent(pipeline.store, AGENT).lost == 1

    result = as_json("rescore", "--agent-id", AGENT)
    assert result["lost"] == [late] and sorted(result["already_trained"]) == sorted(trained)
    text = " ".join(cli("rescore", "--agent-id", AGENT, "--episode-id", late).stdout.split())
    assert "already trained (0; recorded, not learned again): -" in text
    assert ("lost (1; no run learned their earlier score and none reads behind the cursor: recorded, not learned): "
            f"{late}") in text
    assert audit_agent(pipeline.store, AGENT).lost == 1  # still lost: a re-score cannot make a run read it


def judging_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, share: str) -> LocalPipeline:
    """The embedded runner on a fresh file, judging ``share`` of the agent's episodes."""
    clear_settings(monkeypatch)
    monkeypatch.setenv("AGENT_LEARNING_SQLITE_PATH", str(tmp_path / "local.db"))
    monkeypatch.setenv("AGENT_LEARNING_JUDGING", f"{AGENT}={share}")
    monkeypatch.setenv("AGENT_LEARNING_GUARDRAIL", "warn")  # a dozen judged episodes: too few to judge the update
    return open_local(load_settings(), clock=ManualClock())


def test_episodes_left_unjudged_are_shown_audited_and_judged_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = judging_share(tmp_path, monkeypatch, "0.4")  # the embedded runner honours the setting
    scenario = math_tutor(AGENT)
    create_policy(p.store, SoftmaxPolicy.from_actions(AGENT, scenario.actions).to_document(created_at=p.clock.now()))
    ids = episodes(p, 20)
    report = p.run_once()
    left_out = sorted(i for i in ids if id_fraction(i) >= 0.4)
    assert report.outcomes["unjudged"] == len(left_out) > 2 and report.outcomes["scored"] == 20 - len(left_out)
    p.store.close()
    p.queue.close()

    books = as_json("audit")["agents"][AGENT]
    assert (books["unjudged"], books["unjudged_by_reason"]) == (len(left_out), {"sampled_out": len(left_out)})
    assert (books["lost"], books["pending"], books["ok"]) == (0, 0, True)
    text = cli("audit").stdout
    assert f"not judged (AGENT_LEARNING_JUDGING): sampled_out {len(left_out)}" in text and "NOT OK" not in text
    listed = {r["id"]: r for r in as_json("episodes", "list", "--limit", "50")}
    assert {i for i, r in listed.items() if r["unjudged"] == "sampled_out"} == set(left_out)
    assert all(listed[i]["reward"] is None for i in left_out)
    shown = cli("episodes", "show", left_out[0]).stdout
    assert f"not judged: sampled out by AGENT_LEARNING_JUDGING {AGENT}=0.4" in shown
    assert as_json("episodes", "show", left_out[0])["unjudged"]["reason"] == "sampled_out"

    for bad in (["--unjudged", "--rejudge"], ["--unjudged", "--episode-id", left_out[0]], ["--limit", "2"]):
        refused = cli("rescore", "--agent-id", AGENT, *bad)
        assert refused.exit_code == 2 and ("--unjudged" in refused.stderr or "--limit" in refused.stderr), bad
    by_id = as_json("rescore", "--agent-id", AGENT, "--episode-id", left_out[0], code=1)
    assert "rescore --unjudged" in by_id["failed"][0]["description"]

    part = as_json("rescore", "--agent-id", AGENT, "--unjudged", "--limit", "2")
    assert part == {"judged": left_out[:2], "duplicates": [], "failed": [], "stopped": None, "more": True}
    rest = cli("rescore", "--agent-id", AGENT, "--unjudged")
    assert rest.exit_code == 0 and f"judged {len(left_out) - 2} unjudged episodes" in rest.stdout
    assert as_json("rescore", "--agent-id", AGENT, "--unjudged")["judged"] == []  # nothing left
    books = as_json("audit")["agents"][AGENT]
    assert (books["unjudged"], books["pending_training"], books["lost"]) == (0, len(left_out), 0)
    assert as_json("train")["training"][0]["status"] == "published"
    assert as_json("audit")["agents"][AGENT]["learned"] == 20


def test_a_long_rescore_lists_ten_ids_and_counts_the_rest_and_reports_progress(pipeline: LocalPipeline) -> None:
    trained = episodes(pipeline, 14)
    pipeline.run_once()
    text = " ".join(cli("rescore", "--agent-id", AGENT).stdout.split())  # as one line, however wrapped
    assert "already trained (14; recorded, not learned again): " in text
    assert sum(e in text for e in trained) == 10 and ", … and 4 more (--json lists them all)" in text
    done: list[int] = []
    result = rescore(pipeline.store, pipeline.scorer, AGENT, episode_ids=[*trained[:3], "nope"], progress=done.append)
    assert done == [1, 2, 3, 4] and len(result.already_trained) == 3 and len(result.failed) == 1


def test_audit_of_one_agent_with_a_corrupt_policy_reports_it_as_the_whole_audit_does(pipeline: LocalPipeline) -> None:
    episodes(pipeline, 5)
    pipeline.run_once()
    raw = load_current(pipeline.store, AGENT).to_dict()  # type: ignore[union-attr]
    pipeline.store.put_raw_current_policy(AGENT, {**raw, "temperature": 0.001})
    whole = as_json("audit", code=1)["agents"][AGENT]
    one = as_json("audit", "--agent-id", AGENT, code=1)["agents"][AGENT]
    assert one == whole and "the current policy document is invalid" in one["problems"][0]
    assert one["learned"] == 5
    text = cli("audit", "--agent-id", AGENT)
    assert text.exit_code == 1 and "temperature" in text.stdout and "NOT OK" in text.stdout


def test_a_limited_judging_of_the_backlog_goes_past_expired_episodes_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = judging_share(tmp_path, monkeypatch, "0")
    scenario = math_tutor(AGENT)
    create_policy(p.store, SoftmaxPolicy.from_actions(AGENT, scenario.actions).to_document(created_at=p.clock.now()))
    ids = sorted(episodes(p, 3))
    assert p.run_once().outcomes["unjudged"] == 3
    gone = "0-expired"  # sorts first; its episode expired by TTL after it was recorded
    p.store.mark_unjudged(make_unjudged(gone, agent_id=AGENT, action_id=scenario.actions[0].id))
    p.store.close()
    p.queue.close()

    first = cli("rescore", "--agent-id", AGENT, "--unjudged", "--limit", "2")
    text = " ".join(first.stdout.split())
    assert first.exit_code == 1 and f"failed: {gone}: EpisodeNotFound" in text
    assert "judged 2 unjudged episodes" in text and all(i in text for i in ids[:2])
    assert "not judged, for a reason retrying does not fix: 1 episode; each run tries them again" in text
    second = as_json("rescore", "--agent-id", AGENT, "--unjudged", "--limit", "2", code=1)
    assert second["judged"] == ids[2:] and [f["episode_id"] for f in second["failed"]] == [gone]
    assert not second["more"]


def test_evaluate_after_a_rescore_with_other_weights_estimates_one_reward_function(
    pipeline: LocalPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix the 30 re-scored rewards were averaged with the 30 others, of another scale."""
    ids = episodes(pipeline, 60)  # enough that the update's estimate does not rest on a few episodes
    pipeline.run_once()
    before = as_json("evaluate", "--agent-id", AGENT)
    assert before["episodes"] == 60 and not before["notes"]
    monkeypatch.setenv("AGENT_LEARNING_W_INTENT", "0")
    # Enough re-scored that their estimate does not rest on a few episodes either (no note of its own).
    rescored = as_json("rescore", "--agent-id", AGENT, *(a for i in ids[:30] for a in ("--episode-id", i)))
    assert len(rescored["already_trained"]) == 30
    after = as_json("evaluate", "--agent-id", AGENT)
    assert after["episodes"] == 30 and after["reward_function"] != before["reward_function"]
    (note,) = after["notes"]
    assert note.startswith(f"rewards of reward function {after['reward_function']} (the newest score's) only: "
                           f"episodes rewarded by another (30 of {before['reward_function']}) are left out")
