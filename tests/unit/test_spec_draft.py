"""DraftModelProposer's bookkeeping on a fake model (issue 8): what it feeds each step (only the
tokens whose draft KV is not valid yet), its own block pool (no draft when full, blocks back on
release), and the caps on k. The real model's side is tests/e2e/test_speculative_draft.py."""
from __future__ import annotations

import torch

from nextok.engine.sequence import Sequence
from nextok.sampling_params import SamplingParams
from nextok.spec.draft import DraftModelProposer

VOCAB = 50


class _FakeModel:
    """The next token is always (token + 1) % VOCAB: hidden rows carry the token fed."""

    def __call__(self, ids, positions, kv_caches, meta):
        return ids.float().unsqueeze(1)  # [T, 1]

    def compute_logits(self, hidden):
        return torch.nn.functional.one_hot((hidden[:, 0].long() + 1) % VOCAB, VOCAB).float()


class _FakeRunner:
    block_size = 4
    device = torch.device("cpu")

    def __init__(self):
        self.model = _FakeModel()
        self.chunks = []  # every chunk fed: (token ids, first position, block table)

    def new_kv_caches(self, num_blocks, num_layers):
        pool = torch.zeros(num_blocks, self.block_size, 1, 1)  # never read by the fake model
        return [(pool, pool)] * num_layers

    def capture_graphs(self, kv_caches):
        return None  # CPU: no CUDA graphs

    def chunk_inputs(self, chunks):
        self.chunks += [(list(t), s, list(b)) for t, s, b in chunks]
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i][0]) != 1)
        ids, last = [], [0] * len(chunks)
        for i in order:
            ids += chunks[i][0]
            last[i] = len(ids) - 1
        return torch.tensor(ids), None, None, last


def _proposer(num_blocks=16, max_chunk_tokens=64, max_model_len=100):
    runner = _FakeRunner()
    return DraftModelProposer("self-draft", runner, 2, num_blocks, max_model_len, max_chunk_tokens), runner


def _seq(tokens, max_tokens=50):
    return Sequence("r", tokens, SamplingParams(temperature=0.0, max_tokens=max_tokens))


def test_only_tokens_without_valid_draft_kv_are_fed():
    prop, runner = _proposer()
    seq = _seq([1, 2, 3])
    assert prop.propose_batch([seq], 3) == {seq.seq_id: [4, 5, 6]}
    table = prop.states[seq.seq_id].block_table
    assert [c[:2] for c in runner.chunks] == [([1, 2, 3], 0), ([0], 3), ([0], 4)]  # KV of 1,2,3,4,5
    runner.chunks.clear()
    seq.token_ids += [4, 5, 9]  # drafts 4, 5 accepted, the target's own token 9
    assert prop.propose_batch([seq], 3) == {seq.seq_id: [10, 11, 12]}
    assert runner.chunks[0] == ([9], 5, table)  # 4 and 5 kept their KV
    runner.chunks.clear()
    seq.token_ids += [10, 20]  # draft 10 accepted, 11 rejected: its KV (position 7) is stale
    prop.propose_batch([seq], 3)
    assert runner.chunks[0][:2] == ([20], 7)
    runner.chunks.clear()
    prop.propose_batch([seq], 3)  # nothing happened since: the last token is fed again anyway
    assert runner.chunks[0][:2] == ([20], 7)
    prop.check_integrity()


def test_long_catch_ups_run_in_chunks_and_batch_with_others():
    prop, runner = _proposer(max_chunk_tokens=8)
    long, short = _seq(list(range(1, 21))), _seq([7])
    drafts = prop.propose_batch([long, short], 2)
    assert drafts == {long.seq_id: [21, 22], short.seq_id: [8, 9]}
    fed = [(len(t), s) for t, s, _ in runner.chunks]
    assert fed[:3] == [(8, 0), (8, 8), (4, 16)]  # 20 tokens, 8 per forward
    assert (1, 0) in fed  # the short one rode along in a round with room


def test_a_full_pool_skips_the_draft_and_release_gives_blocks_back():
    prop, _ = _proposer(num_blocks=4)  # 3 usable blocks of 4 tokens
    a, b = _seq([1] * 6), _seq([2] * 6)
    assert set(prop.propose_batch([a, b], 3)) == {a.seq_id}  # a takes 2 blocks (8 tokens)
    assert prop.num_no_room == 1 and prop.num_free_blocks == 1
    prop.release([a.seq_id, b.seq_id, 12345])  # unknown ids are fine
    assert prop.num_free_blocks == 3 and not prop.states
    assert set(prop.propose_batch([b], 3)) == {b.seq_id}
    prop.check_integrity()


def test_drafts_stop_at_max_tokens_and_the_context():
    prop, runner = _proposer(max_model_len=12)
    seq = _seq([1, 2, 3], max_tokens=3)
    seq.token_ids.append(4)  # 1 output token: 2 more allowed, one of them the target's
    assert prop.propose_batch([seq], 4) == {seq.seq_id: [5]}
    near_end = _seq(list(range(1, 10)))  # 9 of 12 tokens: 3 more, one the target's
    assert prop.propose_batch([near_end], 4) == {near_end.seq_id: [10, 11]}
    assert prop.propose_batch([_seq(list(range(1, 12)))], 4) == {}
