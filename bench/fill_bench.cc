// deg fill at a real model's size (issue 13's benchmark): a deg checkpoint at Qwen3.5-0.8B dims
// (--family lfm2: LFM2.5-1.2B, gemma4: Gemma 4 E2B's text decoder) with random bf16 weights and
// fresh heads, built on the spot, fills bench/fill_schema.json (40
// fields: 12 choices, 10 booleans, 15 extracts, two anchored arrays of exactly 10 items, one
// x-generate field of exactly 16 tokens) from synthetic business documents of exactly --tokens
// tokens of a real BPE tokenizer (Qwen3's, fetched by scripts/fetch-test-data; for LFM2 and Gemma 4
// with their chat layout's special tokens added, and LFM2's vocabulary widened from 65,536 to hold
// its ids). Figures, each the
// median of --repeats calls after a warm-up:
//   * one document with the 39 fields that are not generated, and with all 40 (latency);
//   * --docs documents in one call (throughput: documents/s and document tokens/s).
// The schema pins the amount of work (minItems = maxItems, minLength = maxLength on a generated
// value the random LM cannot end early), so random weights decide only the values. With
// --profile, one more single-document call has every op timed (CUDA events): the ops' sum
// against the wall time says how much is host work. --json writes the figures and the filled
// JSON of document 0 (bench/fill_hf.py generates that text token by token for the peer figure).
// Not a test: nothing here asserts on time.
//
// usage: fill_bench [--family qwen3_5|lfm2|gemma4] [--device cuda|cpu] [--gemm auto|exact|bf16]
//                   [--tokens N] [--docs N] [--repeats N] [--layers N]
//                   [--work DIR] [--tokenizer FILE] [--schema FILE] [--json FILE] [--profile]
//                   [--log-level warn|info|debug|trace]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"
#include "core/log.h"
#include "deg/checkpoint.h"
#include "deg/engine.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "kernels/cuda_runtime.h"
#include "model/gemma4.h"
#include "model/lfm2.h"
#include "model/qwen35.h"
#include "text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace deg;
namespace fs = std::filesystem;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw Error(ErrorKind::io, "cannot write " + path.string());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Options {
  std::string family = "qwen3_5", device = "cuda", gemm = "auto", log_level = "warn";
  int64_t tokens = 4096, docs = 32, repeats = 5, layers = 0;
  fs::path work, json;
  fs::path tokenizer = fs::path(DEG_SOURCE_DIR) / ".cache/tokenizers/qwen3/tokenizer.json";
  fs::path schema = fs::path(DEG_SOURCE_DIR) / "bench/fill_schema.json";
  bool profile = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--profile") {
      o.profile = true;
      continue;
    }
    if (i + 1 >= argc) throw Error(ErrorKind::invalid_argument, "missing value after " + a);
    const std::string v = argv[++i];
    if (a == "--family") {
      o.family = v;
    } else if (a == "--device") {
      o.device = v;
    } else if (a == "--log-level") {
      o.log_level = v;
    } else if (a == "--gemm") {
      o.gemm = v;
    } else if (a == "--tokens") {
      o.tokens = std::stoll(v);
    } else if (a == "--docs") {
      o.docs = std::stoll(v);
    } else if (a == "--repeats") {
      o.repeats = std::stoll(v);
    } else if (a == "--layers") {
      o.layers = std::stoll(v);
    } else if (a == "--work") {
      o.work = v;
    } else if (a == "--tokenizer") {
      o.tokenizer = v;
    } else if (a == "--schema") {
      o.schema = v;
    } else if (a == "--json") {
      o.json = v;
    } else {
      throw Error(ErrorKind::invalid_argument, "unknown option " + a);
    }
  }
  if (o.tokens < 16 || o.docs < 1 || o.repeats < 1 || o.layers < 0)
    throw Error(ErrorKind::invalid_argument, "--tokens >= 16, --docs >= 1, --repeats >= 1");
  if (o.family != "qwen3_5" && o.family != "lfm2" && o.family != "gemma4")
    throw Error(ErrorKind::invalid_argument, "--family: qwen3_5, lfm2 or gemma4");
  return o;
}

// config.json of an HF Qwen3.5 text model with `cfg`'s dims.
Json qwen35_config_json(const Qwen35Config& c) {
  Json types = Json::array();
  for (LayerKind k : c.layers)
    types.push_back(k == LayerKind::attention ? "full_attention" : "linear_attention");
  return {{"architectures", {"Qwen3_5ForCausalLM"}},
          {"model_type", "qwen3_5_text"},
          {"vocab_size", c.vocab},
          {"hidden_size", c.hidden},
          {"intermediate_size", c.intermediate},
          {"num_hidden_layers", int64_t(c.layers.size())},
          {"layer_types", types},
          {"num_attention_heads", c.heads},
          {"num_key_value_heads", c.kv_heads},
          {"head_dim", c.head_dim},
          {"linear_num_key_heads", c.lin_k_heads},
          {"linear_num_value_heads", c.lin_v_heads},
          {"linear_key_head_dim", c.lin_k_dim},
          {"linear_value_head_dim", c.lin_v_dim},
          {"linear_conv_kernel_dim", c.conv_kernel},
          {"rms_norm_eps", c.eps},
          {"rope_parameters",
           {{"rope_type", "default"},
            {"rope_theta", c.rope_theta},
            {"partial_rotary_factor", c.partial_rotary}}},
          {"tie_word_embeddings", c.tied}};
}

// config.json of an HF LFM2 model with `cfg`'s dims (its MLP width as built, not adjusted again).
Json lfm2_config_json(const Lfm2Config& c) {
  Json types = Json::array();
  for (LayerKind k : c.layers)
    types.push_back(k == LayerKind::attention ? "full_attention" : "conv");
  return {{"architectures", {"Lfm2ForCausalLM"}},
          {"model_type", "lfm2"},
          {"vocab_size", c.vocab},
          {"hidden_size", c.hidden},
          {"intermediate_size", c.ffn},
          {"block_auto_adjust_ff_dim", false},
          {"num_hidden_layers", int64_t(c.layers.size())},
          {"layer_types", types},
          {"num_attention_heads", c.heads},
          {"num_key_value_heads", c.kv_heads},
          {"conv_L_cache", c.conv_kernel},
          {"norm_eps", c.eps},
          {"rope_theta", c.rope_theta},
          {"tie_word_embeddings", c.tied}};
}

// `pattern` cycled to n entries (a real model's layer pattern for --layers).
template <class T>
std::vector<T> cycled(const std::vector<T>& pattern, int64_t n) {
  std::vector<T> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(pattern[size_t(i) % pattern.size()]);
  return out;
}

struct Base {
  std::string what;  // the model, in words
  Json config;
  std::vector<NamedTensor> weights;
};

// The HF snapshot the checkpoint starts from: the family at its real size (`layers` > 0: that
// many layers of its pattern; Gemma 4: its first `layers`), random bf16 weights, the vocabulary
// at least `vocab`.
Base base_model(const std::string& family, int64_t layers, int64_t vocab) {
  Base b;
  TensorMap weights;
  if (family == "qwen3_5") {
    Qwen35Config cfg = Qwen35Config::preset("0.8b");
    if (layers > 0) cfg.layers = cycled(cfg.layers, layers);
    if (cfg.vocab < vocab)
      throw Error(ErrorKind::internal, "the tokenizer outgrows the vocabulary");
    b.what = fmt::format("Qwen3.5-0.8B dims, {} layers", cfg.layers.size());
    b.config = qwen35_config_json(cfg);
    weights = qwen35_random_weights(cfg, DType::bf16, 1);
  } else if (family == "lfm2") {
    Lfm2Config cfg = Lfm2Config::preset("1.2b");
    if (layers > 0) cfg.layers = cycled(cfg.layers, layers);
    cfg.vocab = std::max(cfg.vocab, vocab);
    b.what =
        fmt::format("LFM2.5-1.2B dims, {} layers, vocabulary {}", cfg.layers.size(), cfg.vocab);
    b.config = lfm2_config_json(cfg);
    weights = lfm2_random_weights(cfg, DType::bf16, 1);
  } else {
    Json text = gemma4_preset_json("e2b");
    const int64_t all = text["num_hidden_layers"].get<int64_t>();
    if (layers > 0 && layers < all) {  // the first layers; the shared ones are the last of all
      text["layer_types"].erase(text["layer_types"].begin() + layers, text["layer_types"].end());
      text["num_hidden_layers"] = layers;
      text["num_kv_shared_layers"] =
          std::max<int64_t>(0, text["num_kv_shared_layers"].get<int64_t>() - (all - layers));
    }
    const Gemma4Config cfg = Gemma4Config::from_json(JsonConfig(text, "<fill_bench gemma4>"));
    if (cfg.vocab < vocab)
      throw Error(ErrorKind::internal, "the tokenizer outgrows Gemma 4's vocabulary");
    b.what = fmt::format("Gemma 4 E2B dims, {} layers", cfg.layers.size());
    b.config = text;
    weights = gemma4_random_weights(cfg, DType::bf16, 1);
  }
  for (auto& [name, t] : weights)
    b.weights.push_back({name == "lm_head.weight" ? name : "model." + name, t});
  return b;
}

// The tokenizer.json at `path` with the special tokens the family's chat layout needs that it
// lacks, appended after its last id; returns it and its id count.
std::pair<Json, int64_t> family_tokenizer(const fs::path& path, const std::string& family) {
  Json tok = Json::parse(read_file(path));
  int64_t next = 0;
  std::set<std::string> have;
  for (const auto& [piece, id] : tok["model"]["vocab"].items()) {
    next = std::max(next, id.get<int64_t>() + 1);
    have.insert(piece);
  }
  for (const Json& t : tok["added_tokens"]) {
    next = std::max(next, t["id"].get<int64_t>() + 1);
    have.insert(t["content"].get<std::string>());
  }
  std::vector<std::string> specials;
  if (family == "lfm2") specials = {"<|startoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"};
  if (family == "gemma4") specials = {"<bos>", "<pad>", "<|turn>", "<turn|>"};
  for (const std::string& s : specials) {
    if (have.count(s)) continue;
    tok["added_tokens"].push_back({{"id", next++},
                                   {"content", s},
                                   {"single_word", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"normalized", false},
                                   {"special", true}});
  }
  return {tok, next};
}

// A deg checkpoint of the family with random bf16 weights and fresh heads, under `work` (base/ is
// the HF snapshot it starts from).
fs::path make_checkpoint(const fs::path& work, const fs::path& tokenizer, const Options& o,
                         std::string* what) {
  const fs::path base = work / "base", ckpt = work / "checkpoint";
  fs::remove_all(base);
  fs::remove_all(ckpt);
  fs::create_directories(base);
  const auto [tok, ids] = family_tokenizer(tokenizer, o.family);
  const Base b = base_model(o.family, o.layers, (ids + 127) / 128 * 128);
  *what = b.what;
  write_text(base / "config.json", b.config.dump(2));
  safetensors_write(base / "model.safetensors", b.weights);
  write_text(base / "tokenizer.json", tok.dump());
  checkpoint_create({.base = base, .out = ckpt, .seed = 2});
  return ckpt;
}

// A synthetic invoice-like document of exactly `tokens` tokens (cut at a token boundary): many
// parties, lines, amounts, dates and e-mail addresses, so every field kind has candidates.
std::string make_document(const text::Tokenizer& tok, int64_t tokens, uint32_t seed) {
  static const char* kNames[] = {"Ana Lopez",   "Bernd Huber",  "Chen Wei",     "Dana Levi",
                                 "Emeka Obi",   "Fatima Zahra", "Gus Svensson", "Hana Sato",
                                 "Ivan Petrov", "Julia Rossi"};
  static const char* kItems[] = {
      "steel brackets", "consulting hours", "laptop stands",  "printer toner",  "cloud storage",
      "office chairs",  "safety gloves",    "network cables", "training seats", "delivery fee"};
  static const char* kWords[] = {"please", "note", "the",      "order",   "was",   "shipped",
                                 "on",     "time", "and",      "invoice", "terms", "apply",
                                 "to",     "all",  "services", "listed",  "below", "thank",
                                 "you",    "for",  "your",     "business"};
  std::mt19937 rng(seed);
  auto pick = [&](auto& arr) { return arr[rng() % (sizeof(arr) / sizeof(arr[0]))]; };
  std::string text = fmt::format(
      "INVOICE No. INV-{:05d}\nIssued: 2026-{:02d}-{:02d}   Due: 2026-{:02d}-{:02d}\n"
      "From: Northwind Trading GmbH, Hafenstrasse {}, 20457 Hamburg, Germany (VAT DE{:09d})\n"
      "To: {} <billing{}@example.com>, {} Market Street, San Francisco, CA\n"
      "PO: PO-{:06d}   Phone: +49 40 {:07d}\n\n",
      rng() % 100000, 1 + rng() % 12, 1 + rng() % 28, 1 + rng() % 12, 1 + rng() % 28,
      1 + rng() % 90, rng() % 1000000000, pick(kNames), rng() % 100, 1 + rng() % 900,
      rng() % 1000000, rng() % 10000000);
  for (int line = 1; int64_t(tok.encode(text).ids.size()) < tokens + 64; ++line) {
    text += fmt::format(
        "{:3d}. {} x {} at EUR {}.{:02d} = EUR {}.{:02d}; contact {} <{}@example.com>. ", line,
        1 + rng() % 20, pick(kItems), 1 + rng() % 500, rng() % 100, 1 + rng() % 9000, rng() % 100,
        pick(kNames), pick(kWords));
    for (int w = 0; w < 12; ++w) text += std::string(pick(kWords)) + " ";
    text += "\n";
  }
  const text::Encoding enc = tok.encode(text);
  return text.substr(0, size_t(enc.byte_offsets[size_t(tokens) - 1].second));
}

// The schema without its x-generate fields.
OrderedJson without_generated(OrderedJson schema) {
  OrderedJson& props = schema["properties"];
  OrderedJson required = OrderedJson::array();
  for (auto it = props.begin(); it != props.end();) {
    if (it->contains("x-generate")) {
      it = props.erase(it);
    } else {
      ++it;
    }
  }
  for (const OrderedJson& r : schema["required"])
    if (props.contains(r.get<std::string>())) required.push_back(r);
  schema["required"] = required;
  return schema;
}

struct Figure {
  double ms = 0;
  std::vector<FillResult> results;
};

Figure time_fill(const Engine& engine, const OrderedJson& schema,
                 const std::vector<std::string>& docs, int64_t repeats) {
  Figure f;
  std::vector<double> ms;
  for (int64_t r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    f.results = engine.fill(schema, docs);
    ms.push_back(ms_since(t0));
  }
  for (const FillResult& res : f.results)
    if (!res.ok()) throw Error(ErrorKind::internal, "a document failed: " + res.error);
  f.ms = median(ms);
  return f;
}

// Answers of a result by kind, and the items of its arrays: the work the schema pins.
std::string work_done(const FillResult& r) {
  std::map<std::string, int> kinds;
  for (const FieldReport& f : r.fields) ++kinds[f.kind];
  std::string out;
  for (const auto& [k, n] : kinds) out += fmt::format("{}{} {}", out.empty() ? "" : ", ", n, k);
  for (const char* a : {"line_items", "contacts"})
    if (r.value.contains(a)) out += fmt::format("; {} {} items", a, r.value[a].size());
  return out;
}

void run(const Options& o) {
  log::setup(o.log_level);
  const std::vector<CudaDeviceInfo> gpus = cuda_devices();
  const std::string hw =
      o.device == "cuda" ? (gpus.empty() ? "no GPU visible" : gpus[0].name) : "CPU";
  const fs::path work = o.work.empty() ? fs::temp_directory_path() / "deg_fill_bench" : o.work;
  auto t0 = Clock::now();
  std::string what;
  const fs::path ckpt = make_checkpoint(work, o.tokenizer, o, &what);
  fmt::print("checkpoint ({}, random bf16): {:.1f} s\n", what, ms_since(t0) / 1e3);

  t0 = Clock::now();
  const Engine engine = Engine::open({.model = ckpt, .device = o.device, .gemm = o.gemm});
  fmt::print("open: {:.0f} ms\n", ms_since(t0));
  const text::Tokenizer tok = text::Tokenizer::load(o.tokenizer);
  std::vector<std::string> docs;
  for (int64_t d = 0; d < o.docs; ++d) docs.push_back(make_document(tok, o.tokens, uint32_t(d)));
  const OrderedJson full = OrderedJson::parse(read_file(o.schema));
  const OrderedJson plain = without_generated(full);
  const std::vector<std::string> one{docs[0]};

  t0 = Clock::now();
  time_fill(engine, full, one, 1);  // warm-up (and the GEMM tuning of each shape)
  fmt::print("warm-up (first fill): {:.0f} ms\n", ms_since(t0));

  fmt::print("\ndeg fill on {} ({}, --gemm {}), {}, a {}-token document, {} fields\n", hw, o.device,
             o.gemm, what, o.tokens, full["properties"].size());
  const Figure f39 = time_fill(engine, plain, one, o.repeats);
  fmt::print("  one document, {} fields (no x-generate): {:8.1f} ms   [{}]\n",
             plain["properties"].size(), f39.ms, work_done(f39.results[0]));
  const Figure f40 = time_fill(engine, full, one, o.repeats);
  fmt::print("  one document, {} fields:                 {:8.1f} ms   [{}]\n",
             full["properties"].size(), f40.ms, work_done(f40.results[0]));
  const Figure batch = time_fill(engine, full, docs, std::max<int64_t>(1, o.repeats / 2));
  const double docs_per_s = double(o.docs) / (batch.ms / 1e3);
  fmt::print(
      "  {} documents in one call:                {:8.1f} ms = {:.1f} documents/s, {:.0f} "
      "document tokens/s\n",
      o.docs, batch.ms, docs_per_s, docs_per_s * double(o.tokens));

  std::vector<OpTime> ops;
  double profiled_ms = 0;
  if (o.profile && o.device == "cuda") {
    cuda_profile_start();
    profiled_ms = time_fill(engine, full, one, 1).ms;
    ops = cuda_profile_stop();
    double sum = 0;
    for (const OpTime& t : ops) sum += t.ms;
    fmt::print("\nprofile of one document, 40 fields: ops {:.1f} ms of {:.1f} ms wall\n", sum,
               profiled_ms);
    for (const OpTime& t : ops)
      fmt::print("  {:<28} {:8.2f} ms {:7d} calls\n", t.op, t.ms, t.calls);
  }

  if (!o.json.empty()) {
    Json j = {{"hardware", hw},
              {"family", o.family},
              {"model", what},
              {"device", o.device},
              {"gemm", o.gemm},
              {"document_tokens", o.tokens},
              {"one_document_39_fields_ms", f39.ms},
              {"one_document_40_fields_ms", f40.ms},
              {"batch_documents", o.docs},
              {"batch_ms", batch.ms},
              {"documents_per_s", docs_per_s},
              {"document_tokens_per_s", docs_per_s * double(o.tokens)},
              {"output_json", f40.results[0].value.dump()}};
    for (const OpTime& t : ops)
      j["profile"].push_back({{"op", t.op}, {"ms", t.ms}, {"calls", t.calls}});
    write_text(o.json, j.dump(2));
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    run(parse(argc, argv));
  } catch (const std::exception& e) {
    fmt::print(stderr, "fill_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
