"""Token trees are lossless: tree acceptance yields exactly the verifier's distribution (closed
form over random trees and distributions, then chi-square on the sampler), greedy tree decoding
equals transformers' greedy decoding for every drafter, and sampled tree decoding follows the
exact distribution of plain sampling."""

from __future__ import annotations

import itertools
import json
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import (
    SAMPLING,
    check_sampling_is_exact,
    chi_square_pvalue,
    greedy_text_ngram,
    hf_greedy,
    random_prompts,
    run_cli,
    save,
    tiny_gemma,
    tiny_llama,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from polyspec.acceptance import greedy_tree_verdict, node_outcomes, tree_rejection_verdict
from polyspec.decoding import Decoder
from polyspec.drafters.model import ModelDrafter
from polyspec.drafters.prompt_lookup import PromptLookupDrafter
from polyspec.errors import UserError
from polyspec.models import LoadedModel
from polyspec.sampling import LogitsProcessor, SamplingConfig
from polyspec.specs import make_drafter
from polyspec.tree import ROOT, TokenTree, best_first, select_by_score
from polyspec.types import EMPTY_DRAFT

VOCAB = 8
BASE = [3, 1, 4, 1, 5]  # the context before the tree: the repetition penalty sees it

CONFIGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.8, top_k=4),
    SamplingConfig(temperature=1.0, top_p=0.7),
    SamplingConfig(temperature=1.0, top_k=5, top_p=0.9, repetition_penalty=1.5, penalty_window=3),
]


class Rows:
    """A distribution after every path: random logits per path, processed after BASE + path."""

    def __init__(self, seed: int, config: SamplingConfig, vocab: int = VOCAB) -> None:
        self.seed, self.processor, self.vocab = seed, LogitsProcessor(config), vocab
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}

    def logits(self, path) -> torch.Tensor:
        generator = torch.Generator().manual_seed(hash((self.seed, *path)) % 2**31)
        return torch.randn(1, self.vocab, generator=generator) * 2

    def __call__(self, path) -> torch.Tensor:
        key = tuple(path)
        if key not in self.memo:
            row = self.processor.probs_after(self.logits(key), BASE, [list(key)])[0].double()
            self.memo[key] = row / row.sum()  # exactly normalised in float64
        return self.memo[key]

    def block(self, tree: TokenTree) -> torch.Tensor:
        """The verifier's rows for a tree, as the engine builds them: one processor call."""
        paths = [[], *(tree.path_tokens(i) for i in range(len(tree)))]
        logits = torch.cat([self.logits(tuple(p)) for p in paths])
        return self.processor.probs_after(logits, BASE, paths)


def plain_joint(target: Rows, length: int) -> dict[tuple[int, ...], float]:
    """P(first `length` tokens) under plain sampling: the product of the rows."""
    joint = {(): 1.0}
    for _ in range(length):
        grown = {}
        for prefix, mass in joint.items():
            row = target(prefix)
            for token in row.nonzero().flatten().tolist():
                grown[(*prefix, token)] = mass * float(row[token])
        joint = grown
    return joint


def continue_plain(target: Rows, prefix: tuple[int, ...], mass: float, length: int, out: dict) -> None:
    """Add the plain continuation of `prefix` to `length` tokens, weighted by `mass`, to `out`."""
    if len(prefix) >= length:
        out[prefix[:length]] += mass
        return
    row = target(prefix)
    for token in row.nonzero().flatten().tolist():
        continue_plain(target, (*prefix, token), mass * float(row[token]), length, out)


def tree_joint(tree: TokenTree, target: Rows, length: int) -> dict[tuple[int, ...], float]:
    """Closed form: P(first `length` tokens) when one tree step emits its accepted path and the
    verifier's token, and plain sampling goes on from there."""
    out: dict[tuple[int, ...], float] = defaultdict(float)

    def visit(node: int, path: tuple[int, ...], mass: float) -> None:
        children = tree.children(node)
        draft_row = tree.probs[children[0]].double() if children and tree.probs is not None else None
        taken, rejected, residual = node_outcomes(target(path), [tree.tokens[c] for c in children], draft_row)
        for child, chance in zip(children, taken, strict=True):
            if chance > 0:
                visit(child, (*path, tree.tokens[child]), mass * chance)
        if rejected > 0:
            for token in residual.nonzero().flatten().tolist():
                continue_plain(target, (*path, token), mass * rejected * float(residual[token]), length, out)

    visit(ROOT, (), 1.0)
    return out


def assert_same(joint: dict, expected: dict) -> None:
    keys = set(joint) | set(expected)
    worst = max(abs(joint.get(k, 0.0) - expected.get(k, 0.0)) for k in keys)
    assert worst < 1e-9, worst
    assert abs(sum(joint.values()) - 1.0) < 1e-9


@st.composite
def point_mass_trees(draw, max_nodes: int = 7, max_depth: int = 3) -> TokenTree:
    """Random shapes with distinct sibling tokens, nodes in topological order."""
    tokens, parents, depths = [], [], []
    for _ in range(draw(st.integers(0, max_nodes))):
        parent = draw(st.integers(-1, len(tokens) - 1))
        depth = 1 if parent == ROOT else depths[parent] + 1
        if depth > max_depth:
            continue
        siblings = {tokens[i] for i, p in enumerate(parents) if p == parent}
        free = [t for t in range(VOCAB) if t not in siblings]
        tokens.append(draw(st.sampled_from(free)))
        parents.append(parent)
        depths.append(depth)
    return TokenTree(tokens=tokens, parents=parents)


# Tree structure and building.


def test_tree_navigation():
    tree = TokenTree(tokens=[5, 6, 7, 8, 9], parents=[-1, -1, 0, 2, 0])
    assert tree.children(ROOT) == [0, 1] and tree.children(0) == [2, 4] and tree.children(3) == []
    assert tree.path(3) == [0, 2, 3] and tree.path_tokens(3) == [5, 7, 8] and tree.path(ROOT) == []
    assert tree.depths == [1, 1, 2, 3, 2] and tree.depth == 3 and not tree.is_chain
    assert tree.forward_parents() == [-1, 0, 0, 1, 3, 1]
    chain = TokenTree.chain([4, 4, 4])
    assert chain.is_chain and chain.parents == [-1, 0, 1] and chain.depth == 3


@pytest.mark.parametrize(
    ("tokens", "parents", "probs"),
    [
        ([1, 2], [-1, 1], None),  # a parent after its child
        ([1, 2], [-1, -2], None),
        ([1, 1], [-1, -1], None),  # point-mass siblings repeat a token
        ([1], [-1, -1], None),
        ([1, 1], [-1, -1], torch.eye(4)[:2]),  # siblings drawn from different rows
        ([1, 2], [-1, 0], torch.ones(3, 4) / 4),  # wrong number of rows
    ],
)
def test_invalid_trees_are_refused(tokens, parents, probs):
    with pytest.raises(ValueError):
        TokenTree(tokens=tokens, parents=parents, probs=probs)


def test_stochastic_siblings_may_repeat_a_token():
    row = torch.full((4,), 0.25)
    tree = TokenTree(tokens=[1, 1], parents=[-1, -1], probs=torch.stack([row, row]))
    assert tree.children(ROOT) == [0, 1]


def random_expand(seed: int, width: int):
    """A deterministic ranking per path with random probabilities (no ties)."""

    def expand(node, path, limit):
        rng = random.Random(hash((seed, *path)))
        probs = sorted((rng.random() for _ in range(width)), reverse=True)
        total = sum(probs) * (1 + rng.random())
        tokens = rng.sample(range(50), width)
        return list(zip(tokens, (p / total for p in probs), strict=True))[:limit]

    return expand


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), width=st.integers(1, 4), budget=st.integers(0, 12), depth=st.integers(1, 4))
def test_best_first_is_the_budget_of_most_probable_paths(seed, width, budget, depth):
    expand = random_expand(seed, width)
    tree = best_first(expand, budget, depth)
    # Brute force: every path up to `depth`, scored by its probability product.
    everything = {}
    frontier = [((), 1.0)]
    for _ in range(depth):
        grown = []
        for path, score in frontier:
            for token, prob in expand(None, list(path), width):
                everything[(*path, token)] = score * prob
                grown.append(((*path, token), score * prob))
        frontier = grown
    best = sorted(everything, key=lambda p: -everything[p])[:budget]
    chosen = {tuple(tree.path_tokens(i)) for i in range(len(tree))}
    assert chosen == set(best)
    assert len(tree) == min(budget, len(everything)) and tree.depth <= depth
    for i, parent in enumerate(tree.parents):
        assert parent == ROOT or tree.scores[parent] >= tree.scores[i]


def test_select_by_score_keeps_ancestors():
    tokens, parents, scores = [1, 2, 3, 4, 5], [-1, -1, 0, 2, 1], [0.5, 0.4, 0.45, 0.3, 0.35]
    chosen = select_by_score(tokens, parents, scores, 3)
    assert chosen == ([1, 2, 3], [-1, -1, 0], [0.5, 0.4, 0.45], [0, 1, 2])
    t, p, _, _ = select_by_score(tokens, parents, scores, 4)
    assert t == [1, 2, 3, 5] and p == [-1, -1, 0, 1]


# Greedy acceptance.


@settings(max_examples=200, deadline=None)
@given(tree=point_mass_trees(), seed=st.integers(0, 10**6))
def test_greedy_tree_follows_the_verifier_argmax(tree, seed):
    target = Rows(seed, SamplingConfig(temperature=1.0, repetition_penalty=1.3))
    choices = [int(target(p).argmax()) for p in [[], *(tree.path_tokens(i) for i in range(len(tree)))]]
    verdict = greedy_tree_verdict(tree, choices)
    emitted = [*(tree.tokens[i] for i in verdict.path), verdict.token]
    rollout = []
    for _ in range(len(emitted)):
        rollout.append(int(target(rollout).argmax()))
    assert emitted == rollout  # exactly what plain greedy decoding emits
    assert verdict.accepted == len(verdict.path)
    last = verdict.path[-1] if verdict.path else ROOT
    assert verdict.token not in [tree.tokens[c] for c in tree.children(last)]  # no longer match exists


# Sampling acceptance: closed form.


@settings(max_examples=150, deadline=None)
@given(tree=point_mass_trees(), seed=st.integers(0, 10**6), config=st.sampled_from(CONFIGS))
def test_point_mass_tree_step_emits_exactly_the_target(tree, seed, config):
    target = Rows(seed, config)
    length = tree.depth + 1
    assert_same(tree_joint(tree, target, length), plain_joint(target, length))


@settings(max_examples=150, deadline=None)
@given(tree=point_mass_trees(max_nodes=6), seed=st.integers(0, 10**6), config=st.sampled_from(CONFIGS))
def test_first_emitted_token_is_the_target_row(tree, seed, config):
    target = Rows(seed, config)
    first = defaultdict(float)
    for sequence, mass in tree_joint(tree, target, 1).items():
        first[sequence[0]] += mass
    row = target(())
    for token in range(VOCAB):
        assert abs(first.get(token, 0.0) - float(row[token])) < 1e-9


def test_point_mass_children_are_taken_with_their_target_probability():
    """Trying without replacement: child i is taken with p(xi), whatever the order."""
    target = Rows(2, CONFIGS[0])(())
    for order in itertools.permutations([0, 3, 5]):
        taken, rejected, residual = node_outcomes(target, list(order), None)
        for token, chance in zip(order, taken, strict=True):
            assert abs(chance - float(target[token])) < 1e-12
        assert abs(rejected - (1 - float(target[list(order)].sum()))) < 1e-12
        assert float(residual[list(order)].sum()) == 0.0


def stochastic_joint(shape: dict, target: Rows, draft: Rows, length: int) -> dict:
    """Closed form for children drawn i.i.d. from the draft row at every node: averages over
    every draw of a node's children. shape: node -> number of children, keyed by the path of
    child indices."""
    out: dict[tuple[int, ...], float] = defaultdict(float)

    def visit(where: tuple[int, ...], path: tuple[int, ...], mass: float) -> None:
        count = shape.get(where, 0)
        q = draft(path)
        support = q.nonzero().flatten().tolist()
        for draws in itertools.product(support, repeat=count):
            weight = mass * float(np.prod([float(q[x]) for x in draws]))
            taken, rejected, residual = node_outcomes(target(path), list(draws), q if count else None)
            for i, (token, chance) in enumerate(zip(draws, taken, strict=True)):
                if chance > 0:
                    visit((*where, i), (*path, token), weight * chance)
            if rejected > 0:
                for token in residual.nonzero().flatten().tolist():
                    continue_plain(target, (*path, token), weight * rejected * float(residual[token]), length, out)

    visit((), (), 1.0)
    return out


SHAPES = [
    {(): 1},  # a one-token chain: the chain rule itself
    {(): 3},
    {(): 2, (0,): 2, (1,): 1},
    {(): 1, (0,): 3},
    {(): 2, (1,): 1, (1, 0): 1},
]
DRAFT_CONFIGS = [SamplingConfig(temperature=1.0, top_k=3), SamplingConfig(temperature=0.7, top_k=4, top_p=0.9)]


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from(SHAPES),
    target_seed=st.integers(0, 10**6),
    draft_seed=st.integers(0, 10**6),
    target_config=st.sampled_from(CONFIGS),
    draft_config=st.sampled_from(DRAFT_CONFIGS),
)
def test_stochastic_tree_step_emits_exactly_the_target(shape, target_seed, draft_seed, target_config, draft_config):
    target, draft = Rows(target_seed, target_config), Rows(draft_seed, draft_config)
    depth = max(len(where) + 1 for where in shape)
    length = depth + 1
    assert_same(stochastic_joint(shape, target, draft, length), plain_joint(target, length))


# Sampling acceptance: the sampler follows the closed form.


def draw_stochastic_tree(shape: dict, draft: Rows, generator: torch.Generator) -> TokenTree:
    tokens, parents, rows = [], [], []

    def grow(where, node, path):
        q = draft(path).float()
        for i in range(shape.get(where, 0)):
            token = int(torch.multinomial(q, 1, generator=generator))
            tokens.append(token)
            parents.append(node)
            rows.append(q)
            grow((*where, i), len(tokens) - 1, (*path, token))

    grow((), ROOT, ())
    return TokenTree(tokens=tokens, parents=parents, probs=torch.stack(rows) if rows else None)


def sampled_sequences(make_tree, target: Rows, length: int, trials: int, seed: int) -> list[tuple[int, ...]]:
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(trials):
        tree = make_tree(generator)
        verdict = tree_rejection_verdict(tree, target.block(tree).__getitem__, generator)
        sequence = [*(tree.tokens[i] for i in verdict.path), verdict.token]
        while len(sequence) < length:
            sequence.append(int(torch.multinomial(target(sequence).float(), 1, generator=generator)))
        samples.append(tuple(sequence[:length]))
    return samples


@pytest.mark.slow
def test_sampled_point_mass_tree_verdicts_follow_the_target():
    config = SamplingConfig(temperature=1.0, top_k=5, repetition_penalty=1.5, penalty_window=3)
    target = Rows(17, config)
    # The verifier's likely tokens, so that branches are often taken.
    first = target(()).argsort(descending=True).tolist()
    second = target((first[0],)).argsort(descending=True).tolist()
    tree = TokenTree(tokens=[first[0], first[1], first[2], second[0], second[1]], parents=[-1, -1, -1, 0, 0])
    samples = sampled_sequences(lambda g: tree, target, 3, 5000, seed=0)
    taken = sum(s[0] in first[:3] for s in samples)
    assert taken > 2500  # the branches were really used
    assert chi_square_pvalue(samples, plain_joint(target, 3)) > 1e-3


@pytest.mark.slow
def test_sampled_stochastic_tree_verdicts_follow_the_target():
    target = Rows(23, SamplingConfig(temperature=1.0, top_k=5, repetition_penalty=1.5, penalty_window=3))
    draft = Rows(29, SamplingConfig(temperature=1.0, top_k=4))
    shape = {(): 2, (0,): 2, (1,): 1}
    samples = sampled_sequences(lambda g: draw_stochastic_tree(shape, draft, g), target, 3, 5000, seed=1)
    assert chi_square_pvalue(samples, plain_joint(target, 3)) > 1e-3


# The engine: trees through the decoder and the command line.


@pytest.fixture(scope="module")
def draft_model(draft_dir):
    return LoadedModel.load(str(draft_dir), dtype="float32")


@pytest.fixture(scope="module")
def ngram_path(tmp_path_factory, verifier, tokenizer) -> Path:
    return greedy_text_ngram(verifier, tokenizer, tmp_path_factory.mktemp("tree-ngram"))


class Branches:
    """Wraps a tree drafter and counts the trees that really branched."""

    def __init__(self, drafter) -> None:
        self.drafter, self.branched, self.trees = drafter, 0, 0

    def start(self, prompt_ids, processor, generator) -> None:
        self.drafter.start(prompt_ids, processor, generator)

    def propose(self, context, k):
        return self.drafter.propose(context, k)

    def propose_tree(self, context, budget, max_depth):
        tree = self.drafter.propose_tree(context, budget, max_depth)
        assert len(tree) <= budget and tree.depth <= max_depth
        self.trees += 1
        self.branched += not tree.is_chain
        return tree


def tree_drafters(verifier, draft_model, ngram_path) -> dict:
    return {
        "prompt-lookup": PromptLookupDrafter(1, 3),
        "ngram": make_drafter(f"ngram:{ngram_path}", verifier),
        "ngram+context": make_drafter(f"ngram:{ngram_path}+context", verifier),
        "model": ModelDrafter(draft_model, verifier.vocab_size),
    }


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_greedy_tree_decoding_equals_transformers_for_every_drafter(verifier, draft_model, ngram_path, penalty):
    decoder = Decoder(verifier)
    sampling = SamplingConfig(temperature=0.0, repetition_penalty=penalty)
    max_new = 30  # several times the sliding window of 8
    drafters = {name: Branches(d) for name, d in tree_drafters(verifier, draft_model, ngram_path).items()}
    accepted = dict.fromkeys(drafters, 0)
    for prompt in random_prompts(6, seed=3):
        expected = hf_greedy(verifier.model, prompt, max_new, repetition_penalty=penalty)
        for (name, drafter), (gamma, budget) in itertools.product(drafters.items(), [(2, 4), (3, 8), (5, 16)]):
            result = decoder.generate(
                prompt, drafter, gamma=gamma, tree=budget, sampling=sampling, max_new_tokens=max_new
            )
            assert result.token_ids == expected, (name, gamma, budget, prompt)
            s = result.stats
            assert s.new_tokens == s.accepted + s.verifier_calls
            assert s.nodes_verified == s.proposed + s.verifier_calls
            accepted[name] += s.accepted
    assert all(accepted.values()), accepted  # the drafts were not all rejected
    assert all(d.branched for d in drafters.values()), {n: d.branched for n, d in drafters.items()}


@pytest.mark.parametrize("family", ["gemma", "llama"])
def test_generate_with_trees_equals_transformers(monkeypatch, tmp_path, tokenizer, draft_dir, ngram_path, family):
    from polyspec.drafters.adaptive import VerifyCosts

    # A fixed, nearly flat width curve (as measured in bfloat16): a curve measured on a busy machine
    # could price every draft out, and the router's drafting is asserted below.
    flat = VerifyCosts((1, 2, 4, 8, 16, 32), (1.0, 1.0, 1.0, 1.08, 1.26, 1.65))
    monkeypatch.setattr("polyspec.specs.verify_costs", lambda verifier: flat)
    model = tiny_gemma(seed=11) if family == "gemma" else tiny_llama(seed=11)
    path = save(model, tokenizer, tmp_path / family)
    prompt = "w5 w6 w7 w5 w6 w7 w9 w5 w6"
    ids = tokenizer(prompt)["input_ids"]
    expected = hf_greedy(model, ids, 30)
    specs = [
        "prompt-lookup",
        f"ngram:{ngram_path}+context",
        f"ngram:{ngram_path}",
        f"model:{draft_dir}",
        f"adaptive:prompt-lookup;ngram:{ngram_path}+context;model:{draft_dir}",
    ]
    for spec, (gamma, budget) in itertools.product(specs, [(3, 8), (4, 16)]):
        code, out, err = run_cli("generate", "--verifier", str(path), "--drafter", spec, "--gamma", str(gamma),
            "--tree", str(budget), "--prompt", prompt, "--max-new-tokens", "30", "--dtype", "float32", "--json",
        )  # fmt: skip
        assert code == 0, err
        result = json.loads(out)
        assert result["token_ids"] == expected, (spec, gamma, budget)
        stats = result["stats"]
        assert stats["nodes_verified"] == stats["proposed"] + stats["verifier_calls"]
        if spec.startswith("adaptive"):
            assert stats["accepted"] > 0 and stats["nodes_verified"] > stats["verifier_calls"] + stats["accepted"]


def test_tree_settings_are_user_errors(verifier_dir, verifier):
    code, _, err = run_cli("generate", "--verifier", str(verifier_dir), "--drafter", "prompt-lookup",
        "--gamma", "4", "--tree", "3", "--prompt", "w5 w6", "--dtype", "float32",
    )  # fmt: skip
    assert code == 2 and "--tree >= 4" in err and len(err.strip().splitlines()) == 1

    class ChainsOnly:
        def start(self, prompt_ids, processor, generator) -> None:
            pass

        def propose(self, context, k):
            return EMPTY_DRAFT

    with pytest.raises(UserError, match="chains only"):
        Decoder(verifier).generate([2, 5], ChainsOnly(), tree=8)


def test_hybrid_models_verify_chains_only(tokenizer):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(1)
    config = Qwen3_5TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, pad_token_id=0,
        eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    hybrid = LoadedModel(model=Qwen3_5ForCausalLM(config).eval(), tokenizer=tokenizer, name="tiny-qwen3.5")
    with pytest.raises(UserError, match="chains only"):
        Decoder(hybrid).generate([2, 5, 6], PromptLookupDrafter(), gamma=3, tree=8)
    assert len(Decoder(hybrid).generate([2, 5, 6], PromptLookupDrafter(), gamma=3, max_new_tokens=5).token_ids) == 5


def test_adaptive_trees_on_a_hybrid_model_are_a_user_error_and_chains_work(monkeypatch, tmp_path, tokenizer):
    from fixtures import tiny_qwen35

    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    path = save(tiny_qwen35(seed=3), tokenizer, tmp_path / "qwen3.5")
    args = ["generate", "--verifier", str(path), "--drafter", "adaptive:prompt-lookup", "--gamma", "3",
            "--prompt", "w5 w6 w5 w6", "--max-new-tokens", "6", "--dtype", "float32", "--json"]  # fmt: skip
    code, _, err = run_cli(*args, "--tree", "8")
    assert code == 2 and "chains only" in err and "drop --tree" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "home" / "verify-costs").exists()  # refused before the drafter measured anything
    code, out, err = run_cli(*args)
    assert code == 0, err
    assert len(json.loads(out)["token_ids"]) == 6


def branching_prompt(verifier) -> list[int]:
    """A prompt whose suffix occurred before with several continuations that together hold a
    good part of the verifier's sampling mass after it, so prompt lookup's branches are used."""
    rng = random.Random(5)
    processor = LogitsProcessor(SAMPLING)
    for _ in range(200):
        motif = [rng.randrange(4, 64) for _ in range(2)]
        prompt = [2, *itertools.chain.from_iterable([*motif, rng.randrange(4, 64)] for _ in range(3)), *motif]
        with torch.inference_mode():
            logits = verifier.model(torch.tensor([prompt])).logits[0, -1:]
        probs = processor.probs(logits, prompt, len(prompt))[0]
        roots = PromptLookupDrafter(1, 3).propose_tree(prompt, 6, 2)
        if float(probs[[roots.tokens[c] for c in roots.children(ROOT)]].sum()) > 0.4:
            return prompt
    raise AssertionError("no prompt found")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["prompt-lookup", "ngram+context", "model"])
def test_sampled_tree_decoding_follows_the_exact_distribution(verifier, draft_model, ngram_path, name):
    drafter = Branches(tree_drafters(verifier, draft_model, ngram_path)[name])
    prompt = branching_prompt(verifier) if name == "prompt-lookup" else None
    check_sampling_is_exact(verifier, drafter, trials=800, tree=6, prompt=prompt)
    assert drafter.branched > drafter.trees // 4


class Drawn:
    """An n-gram drafter whose trees are its independent draws, `widths[d]` at depth d."""

    def __init__(self, drafter, widths) -> None:
        self.drafter, self.widths, self.trees = drafter, widths, []

    def start(self, prompt_ids, processor, generator) -> None:
        self.drafter.start(prompt_ids, processor, generator)

    def propose(self, context, k):
        return self.drafter.propose(context, k)

    def propose_tree(self, context, budget, max_depth):
        tree = self.drafter.propose_sampled_tree(context, self.widths[:max_depth])
        self.trees.append(tree)
        return tree


def test_drawn_trees_are_independent_draws_from_each_nodes_own_row(verifier, ngram_path):
    """Each node's row is the n-gram's distribution after its parent's path, siblings are drawn
    from it independently (chi-square on the first two draws' pairs), and a child repeating an
    earlier sibling's token is a leaf."""
    drafter = make_drafter(f"ngram:{ngram_path}+context", verifier)
    drafter.start([2, 7, 8], LogitsProcessor(SAMPLING), torch.Generator().manual_seed(0))
    rng = random.Random(1)
    contexts = [[2, *(rng.randrange(4, 64) for _ in range(6))] for _ in range(20)]
    # The context whose row spreads widest, so that draws often differ.
    context = max(contexts, key=lambda c: int((drafter.propose(c, 1).probs[0] > 0).sum()))
    row = drafter.propose(context, 1).probs[0]
    assert int((row > 0).sum()) >= 3
    pairs, repeats = [], 0
    for seed in range(3000):
        drafter.generator.manual_seed(seed)
        tree = drafter.propose_sampled_tree(context, (3, 2))
        tree.validate()
        roots = tree.children(ROOT)
        assert len(roots) == 3 and tree.depth <= 2
        pairs.append((tree.tokens[roots[0]], tree.tokens[roots[1]]))
        if seed < 20:  # rows after each path, against the n-gram's own
            for node in range(len(tree)):
                parent = tree.parents[node]
                path = [] if parent == ROOT else tree.path_tokens(parent)
                assert torch.equal(tree.probs[node], drafter.propose([*context, *path], 1).probs[0])
        for node in roots:
            repeated = tree.tokens[node] in [tree.tokens[other] for other in roots if other < node]
            assert len(tree.children(node)) == (0 if repeated else 2)
            repeats += repeated
    support = row.nonzero().flatten().tolist()
    joint = {(a, b): float(row[a] * row[b]) for a in support for b in support}
    assert chi_square_pvalue(pairs, joint) > 1e-3
    assert repeats > 0


@pytest.mark.slow
@pytest.mark.parametrize("widths", [(3, 1, 1), (2, 2)])
def test_sampled_drawn_trees_follow_the_exact_distribution(verifier, ngram_path, widths):
    drafter = Drawn(make_drafter(f"ngram:{ngram_path}+context", verifier), widths)
    check_sampling_is_exact(verifier, drafter, trials=800, tree=6)
    spread = sum(len({tree.tokens[c] for c in tree.children(ROOT)}) > 1 for tree in drafter.trees)
    assert spread > len(drafter.trees) // 6  # the draws really differ
