"""Our engine against an independent reference: Hugging Face transformers reading the GGUF itself.

(1) last-token logits agree within 1e-3 (fp32), (2) greedy 32-token continuations are identical
for 5 chat prompts, (3) also with prefill in chunks of 7 tokens and with 4 sequences of different
lengths decoding in one batch; and our tokenizer encodes exactly as HF's.
"""

import pytest
import torch

from engine.kv_pool import KVPool
from engine.llm import LLM
from engine.model_runner import Chunk, ModelRunner
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for learning to cook.",
    "What is 17 times 23? Show your steps.",
    "Explain recursion in one sentence.",
]
TEXTS = ["Hello 12345 world!!  ok\n\nx", "héllo 世界 🎉 <|im_start|>user\nhi<|im_end|>",
         "def f(x):\n    return x**2  # it's 3.14159", "   leading spaces\tand\ttabs   "]
N_NEW = 32
GREEDY = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return Tokenizer.from_dir(smollm2_dir)


@pytest.fixture(scope="module")
def chat_prompts(tok):
    return [tok.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def hf_greedy(hf_reference, chat_prompts):
    """HF greedy continuations, one prompt at a time, eos not stopping (like ignore_eos)."""
    out = []
    for p in chat_prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            gen = hf_reference.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW,
                                              min_new_tokens=N_NEW, do_sample=False, eos_token_id=None,
                                              pad_token_id=2, suppress_tokens=None)
        out.append(gen[0, len(p):].tolist())
    return out


@pytest.fixture(scope="module")
def llm(smollm2_dir):
    return LLM(smollm2_dir, num_pages=256, page_size=16, torch_threads=2)


def record_chunks(llm):
    """Wrap the runner to record the chunk lengths of every forward call."""
    calls = []
    forward = llm.runner.forward

    def spy(chunks):
        calls.append([len(c.token_ids) for c in chunks])
        return forward(chunks)

    llm.runner.forward = spy
    return calls


def test_tokenizer_matches_hf(tok, hf_reference, chat_prompts):
    hf_tok = hf_reference.tokenizer
    for text in TEXTS:
        assert tok.encode(text) == hf_tok.encode(text), text
        assert tok.decode(tok.encode(text)) == hf_tok.decode(hf_tok.encode(text))
    for q, ours in zip(QUESTIONS, chat_prompts):
        msgs = [{"role": "user", "content": q}]
        assert tok.apply_chat_template(msgs) == hf_tok.apply_chat_template(msgs, tokenize=False,
                                                                           add_generation_prompt=True)
        assert ours == hf_tok(hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)["input_ids"]


def test_last_token_logits_within_1e_3(llm, hf_reference, chat_prompts, tok):
    runner = ModelRunner(llm.model, llm.arch, KVPool(llm.arch, 64, 16))
    prompts = chat_prompts[:3] + [tok.encode(TEXTS[2]), tok.encode("The quick brown fox " * 40)]
    for p in prompts:
        ours = runner.forward([Chunk(list(range(-(-len(p) // 16))), 0, p)])[0]
        with torch.no_grad():
            ref = hf_reference.model(torch.tensor([p])).logits[0, -1].float()
        diff = (ours - ref).abs().max().item()
        assert diff < 1e-3, f"max |logit diff| {diff} for a {len(p)}-token prompt"
        assert ours.argmax() == ref.argmax()


def test_greedy_continuations_identical(llm, chat_prompts, hf_greedy):
    # sanity of the reference: the known answer, then eos, and generation went on past it
    assert hf_greedy[0][:8] == llm.tokenizer.encode("The capital of France is Paris.") + [2]
    assert llm.generate(chat_prompts, GREEDY) == hf_greedy
    llm.allocator.check_integrity()


def test_greedy_identical_with_prefill_chunks_of_7(smollm2_dir, chat_prompts, hf_greedy):
    llm = LLM(smollm2_dir, num_pages=64, page_size=16, prefill_chunk_tokens=7, enable_prefix_cache=False)
    calls = record_chunks(llm)
    assert llm.generate(chat_prompts, GREEDY) == hf_greedy
    prefill = [n for call in calls for n in call if n > 1]
    assert max(prefill) == 7 and prefill.count(7) == sum(len(p) // 7 for p in chat_prompts)
    llm.allocator.check_integrity()


def test_greedy_identical_with_4_sequences_decoding_in_one_batch(smollm2_dir, chat_prompts, hf_greedy):
    llm = LLM(smollm2_dir, num_pages=64, page_size=16, max_num_seqs=4, max_num_batched_tokens=2048,
              enable_prefix_cache=False)
    calls = record_chunks(llm)
    prompts = chat_prompts[:4]
    assert len({len(p) for p in prompts}) == 4, "prompts must differ in length"
    assert llm.generate(prompts, GREEDY) == hf_greedy[:4]
    assert calls[0] == [len(p) for p in prompts]
    assert calls[1:] == [[1, 1, 1, 1]] * (N_NEW - 1)
    llm.allocator.check_integrity()
