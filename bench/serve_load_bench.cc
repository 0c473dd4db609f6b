// Load test of `deg serve` (docs/serve.md, "Load test"): starts the server as a child process on
// a loopback port, runs N clients for a fixed time mixing valid fills (two schemas, one and two
// documents), chat completions (plain and streamed) and bad requests (broken JSON, an unsupported
// schema, a body over the limit, too many documents), and checks that every request got exactly
// one well-formed answer: a status, a JSON body (SSE for streams) that parses, and the error code
// its class expects (or a valid result; 429 `overloaded` is well-formed for every request that
// queues for the engine, and the client then waits the second Retry-After asks). Reports
// throughput, latency percentiles, the 429 rate, and the server's RSS over time (VmRSS of
// /proc/PID/status). Exits 1 when an answer was lost or malformed, the server did not stop
// cleanly, or its RSS at the end is more than 10% over its RSS at --rss-baseline seconds.
//
//   serve_load_bench --model CKPT [--device cpu|cuda] [--clients 8] [--seconds 600]
//                    [--max-queue 4] [--connections 16] [--mix fill=30,chat=15,...]
//                    [--json out.json]
#include <fmt/format.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// What a request is and which answers are well-formed for it.
enum class Kind : uint8_t {
  fill,            // 200 with one report per document (or 429)
  fill_mixed,      // the other schema, two documents
  chat,            // 200 chat.completion whose content is JSON (or 429)
  chat_stream,     // 200 text/event-stream ending in [DONE] (or 429)
  broken_json,     // 400 invalid_json
  unsupported,     // 422 unsupported_schema
  body_too_large,  // 413 body_too_large
  too_many_docs,   // 413 too_many_documents
};
constexpr const char* kKindNames[] = {"fill",           "fill_mixed",   "chat",
                                      "chat_stream",    "broken_json",  "unsupported",
                                      "body_too_large", "too_many_docs"};
constexpr int kKinds = 8;

struct Options {
  std::string deg = DEG_BINARY;
  std::string model;
  std::string device = "cpu";
  int clients = 8;
  double seconds = 600;
  double rss_every = 10;      // seconds between RSS samples
  double rss_baseline = 120;  // the sample RSS at the end is compared with
  int max_queue = 4;          // small, so that a flood meets 429s
  int connections = 16;
  int64_t max_body_bytes = 1 << 20;
  std::string json_out;
  std::string examples = DEG_SOURCE_DIR "/examples";
  // Weights of the request kinds (kKindNames order): mostly work, a fifth bad requests.
  std::vector<int> mix = {30, 15, 15, 10, 8, 8, 6, 8};
};

[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr,
             "serve_load_bench: {}\nusage: serve_load_bench --model CKPT [--device cpu|cuda] "
             "[--clients N] [--seconds S] [--rss-every S] [--rss-baseline S] [--max-queue N] "
             "[--connections N] [--max-body-bytes N] [--deg PATH] [--examples DIR] "
             "[--mix KIND=W,...] [--json FILE]\n",
             why);
  std::exit(2);
}

// "fill=1,chat=2": the weights of the kinds named (the others 0).
std::vector<int> parse_mix(const std::string& text) {
  std::vector<int> weights(kKinds, 0);
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t eq = item.find('=');
    const auto name = std::find(std::begin(kKindNames), std::end(kKindNames), item.substr(0, eq));
    if (eq == std::string::npos || name == std::end(kKindNames)) usage("--mix: " + item);
    weights[size_t(name - std::begin(kKindNames))] = std::stoi(item.substr(eq + 1));
  }
  return weights;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string v = argv[++i];
    try {
      if (flag == "--deg")
        o.deg = v;
      else if (flag == "--model")
        o.model = v;
      else if (flag == "--device")
        o.device = v;
      else if (flag == "--clients")
        o.clients = std::stoi(v);
      else if (flag == "--seconds")
        o.seconds = std::stod(v);
      else if (flag == "--rss-every")
        o.rss_every = std::stod(v);
      else if (flag == "--rss-baseline")
        o.rss_baseline = std::stod(v);
      else if (flag == "--max-queue")
        o.max_queue = std::stoi(v);
      else if (flag == "--connections")
        o.connections = std::stoi(v);
      else if (flag == "--max-body-bytes")
        o.max_body_bytes = std::stoll(v);
      else if (flag == "--examples")
        o.examples = v;
      else if (flag == "--json")
        o.json_out = v;
      else if (flag == "--mix")
        o.mix = parse_mix(v);
      else
        usage("unknown option " + flag);
    } catch (const std::logic_error&) {
      usage(flag + ": not a number: " + v);
    }
  }
  if (o.model.empty()) usage("--model is required (a deg checkpoint)");
  if (o.clients < 1 || o.seconds <= 0 || o.rss_every <= 0) {
    usage("--clients, --seconds and --rss-every must be positive");
  }
  return o;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) usage("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The server as a child process: `deg serve --port 0`, its port read from the line it prints.
struct ServerProcess {
  pid_t pid = -1;
  int port = 0;
  int err_fd = -1;
  std::string log;  // its stderr
  std::thread drain;

  ServerProcess(const Options& o) {
    int err[2];
    if (pipe(err) != 0) usage("pipe failed");
    pid = fork();
    if (pid == 0) {
      dup2(err[1], STDERR_FILENO);
      close(err[0]);
      const std::string queue = std::to_string(o.max_queue), conns = std::to_string(o.connections),
                        body = std::to_string(o.max_body_bytes);
      execl(o.deg.c_str(), o.deg.c_str(), "serve", "--model", o.model.c_str(), "--device",
            o.device.c_str(), "--port", "0", "--max-queue", queue.c_str(), "--connections",
            conns.c_str(), "--max-body-bytes", body.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(err[1]);
    err_fd = err[0];
    char buffer[512];
    while (port == 0) {
      const ssize_t n = read(err_fd, buffer, sizeof buffer);
      if (n <= 0) {
        fmt::print(stderr, "serve_load_bench: deg serve exited before it listened:\n{}\n", log);
        std::exit(1);
      }
      log.append(buffer, size_t(n));
      const size_t at = log.find("http://127.0.0.1:");
      const size_t end =
          at == std::string::npos ? at : log.find_first_not_of("0123456789", at + 17);
      if (end != std::string::npos && end < log.size()) port = std::stoi(log.substr(at + 17));
    }
    drain = std::thread([this] {
      char b[512];
      for (ssize_t n; (n = read(err_fd, b, sizeof b)) > 0;) log.append(b, size_t(n));
    });
  }

  // VmRSS in KiB (0 once the process is gone).
  int64_t rss_kib() const {
    std::ifstream status(fmt::format("/proc/{}/status", pid));
    for (std::string line; std::getline(status, line);) {
      if (line.starts_with("VmRSS:")) return std::stoll(line.substr(6));
    }
    return 0;
  }

  // SIGTERM, then the exit status; true when it exited 0.
  bool stop() {
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    drain.join();
    close(err_fd);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
};

struct Request {
  Kind kind;
  std::string body;
  size_t documents = 1;
};

struct Corpus {
  Json invoice, support;
  std::vector<std::string> invoices, supports;
  int64_t max_body_bytes;

  Request make(Kind kind, std::mt19937_64& random) const {
    auto pick = [&](const std::vector<std::string>& from) { return from[random() % from.size()]; };
    switch (kind) {
      case Kind::fill:
        return {kind, Json({{"schema", invoice}, {"documents", {pick(invoices)}}}).dump()};
      case Kind::fill_mixed:
        return {kind,
                Json({{"schema", support}, {"documents", {pick(supports), pick(supports)}}}).dump(),
                2};
      case Kind::chat:
      case Kind::chat_stream:
        return {kind, Json({{"model", "any"},
                            {"messages", {{{"role", "user"}, {"content", pick(invoices)}}}},
                            {"response_format",
                             {{"type", "json_schema"},
                              {"json_schema", {{"name", "invoice"}, {"schema", invoice}}}}},
                            {"stream", kind == Kind::chat_stream}})
                          .dump()};
      case Kind::broken_json: {
        std::string body = Json({{"schema", invoice}, {"documents", {pick(invoices)}}}).dump();
        return {kind, body.substr(0, random() % body.size())};
      }
      case Kind::unsupported:
        return {kind, R"({"schema": {"type": "object", "properties": {"n": {"not": {}}}},)"
                      R"( "documents": ["x"]})"};
      case Kind::body_too_large:
        return {kind, Json({{"schema", invoice},
                            {"documents", {std::string(size_t(max_body_bytes), 'x')}}})
                          .dump()};
      case Kind::too_many_docs:
        return {
            kind,
            Json({{"schema", invoice}, {"documents", std::vector<std::string>(1025, "x")}}).dump()};
    }
    return {};
  }
};

const char* path_of(Kind k) {
  return k == Kind::chat || k == Kind::chat_stream ? "/v1/chat/completions" : "/v1/fill";
}

// Why `r` is not a well-formed answer to a request of `kind` ("" when it is).
std::string check(Kind kind, const httplib::Result& r, size_t documents) {
  if (!r) return "no answer: " + httplib::to_string(r.error());
  if (r->get_header_value("X-Request-Id").empty()) return "no X-Request-Id";
  const bool stream = kind == Kind::chat_stream && r->status == 200;
  if (stream) {
    if (r->get_header_value("Content-Type") != "text/event-stream") return "stream not SSE";
    size_t at = 0, events = 0;
    std::string last;
    while (at < r->body.size()) {
      const size_t end = r->body.find("\n\n", at);
      if (end == std::string::npos || r->body.compare(at, 6, "data: ") != 0) return "bad SSE";
      last = r->body.substr(at + 6, end - at - 6);
      if (last != "[DONE]" && !Json::accept(last)) return "SSE event not JSON";
      ++events;
      at = end + 2;
    }
    return events >= 3 && last == "[DONE]" ? "" : "SSE without [DONE]";
  }
  Json body;
  try {
    body = Json::parse(r->body);
  } catch (const Json::parse_error&) {
    return fmt::format("{}: body not JSON", r->status);
  }
  auto error_is = [&](int status, const std::string& code) -> std::string {
    if (r->status != status) return fmt::format("status {}, expected {}", r->status, status);
    if (!body.contains("error") || body["error"].value("code", "") != code)
      return "error code is not " + code + ": " + r->body.substr(0, 200);
    return "";
  };
  // Every request that reaches the engine's queue may meet a full one (an unsupported schema is
  // found when its fill compiles the schema).
  if (kind != Kind::broken_json && kind != Kind::body_too_large && kind != Kind::too_many_docs &&
      r->status == 429) {
    return r->get_header_value("Retry-After") == "1" ? error_is(429, "overloaded")
                                                     : "429 without Retry-After";
  }
  switch (kind) {
    case Kind::fill:
    case Kind::fill_mixed: {
      if (r->status != 200) return fmt::format("fill answered {}: {}", r->status, r->body);
      const Json& results = body["results"];
      if (!results.is_array() || results.size() != documents) return "wrong number of results";
      for (const Json& report : results) {
        if (report.value("version", 0) != 1 || !report.contains("value") ||
            !report["fields"].is_array())
          return "not a filled report: " + report.dump().substr(0, 200);
      }
      return "";
    }
    case Kind::chat: {
      if (r->status != 200) return fmt::format("chat answered {}: {}", r->status, r->body);
      const Json& content = body["choices"][0]["message"]["content"];
      return content.is_string() && Json::accept(content.get<std::string>())
                 ? ""
                 : "chat content is not JSON";
    }
    case Kind::chat_stream: return "stream answered " + std::to_string(r->status);
    case Kind::broken_json: return error_is(400, "invalid_json");
    case Kind::unsupported: return error_is(422, "unsupported_schema");
    case Kind::body_too_large: return error_is(413, "body_too_large");
    case Kind::too_many_docs: return error_is(413, "too_many_documents");
  }
  return "unknown kind";
}

struct Sample {
  Kind kind;
  int status;  // 0: no answer
  double seconds;
  size_t documents;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  Corpus corpus{.invoice = Json::parse(read_file(o.examples + "/invoice.schema.json")),
                .support = Json::parse(read_file(o.examples + "/support.schema.json")),
                .max_body_bytes = o.max_body_bytes};
  const std::string invoice = read_file(o.examples + "/invoice.txt");
  const std::string support = read_file(o.examples + "/support.txt");
  for (int i = 0; i < 16; ++i) {
    corpus.invoices.push_back(
        fmt::format("Invoice INV-{} from Shop {} GmbH, total {}.{} EUR, due 2026-0{}-1{}.", 100 + i,
                    i, 10 + 7 * i, 10 + i, 1 + i % 9, i % 10));
    corpus.supports.push_back(
        fmt::format("Order AB-{:06d}: item {} arrived broken, refund please.", 123456 + i, i));
  }
  corpus.invoices.push_back(invoice);
  corpus.supports.push_back(support);

  ServerProcess server(o);
  fmt::print(stderr, "serve_load_bench: deg serve (pid {}) on port {}, {} clients for {} s\n",
             server.pid, server.port, o.clients, o.seconds);

  std::vector<std::pair<double, int64_t>> rss;  // (seconds, KiB)
  std::mutex mutex;
  std::vector<Sample> samples;
  std::map<std::string, int64_t> problems;  // what was wrong -> how often
  std::atomic<bool> running{true};
  const auto start = Clock::now();
  const auto until = start + std::chrono::duration<double>(o.seconds);
  auto since_start = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };

  std::thread sampler([&] {
    for (int k = 0; running; ++k) {
      const auto at = start + std::chrono::duration<double>(k * o.rss_every);
      while (running && Clock::now() < at)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!running) break;
      const int64_t kib = server.rss_kib();
      std::lock_guard lock(mutex);
      rss.emplace_back(since_start(), kib);
    }
  });
  std::vector<std::thread> clients;
  for (int c = 0; c < o.clients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937_64 random(uint64_t(c) * 7919 + 1);
      std::discrete_distribution<int> mix(o.mix.begin(), o.mix.end());
      httplib::Client client("127.0.0.1", server.port);
      client.set_read_timeout(600);
      client.set_write_timeout(60);
      while (Clock::now() < until) {
        const Request req = corpus.make(Kind(mix(random)), random);
        const auto t0 = Clock::now();
        const httplib::Result r = client.Post(path_of(req.kind), req.body, "application/json");
        const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        const std::string why = check(req.kind, r, req.documents);
        std::unique_lock lock(mutex);
        samples.push_back({req.kind, r ? r->status : 0, seconds, req.documents});
        if (!why.empty()) ++problems[fmt::format("{}: {}", kKindNames[int(req.kind)], why)];
        // A polite client: it waits as long as a 429 asks before its next request.
        if (r && r->status == 429) {
          lock.unlock();
          std::this_thread::sleep_for(std::chrono::seconds(1));
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  const double elapsed = since_start();
  running = false;
  sampler.join();
  const int64_t rss_end = server.rss_kib();
  rss.emplace_back(elapsed, rss_end);
  const bool clean_exit = server.stop();

  // Figures.
  std::vector<double> all, fills, chats, bad;
  int64_t overloaded = 0, work = 0, documents = 0;
  std::map<std::string, int64_t> by_status;
  for (const Sample& s : samples) {
    all.push_back(s.seconds);
    const bool is_work = s.kind <= Kind::chat_stream;
    ++by_status[fmt::format("{} {}", kKindNames[int(s.kind)], s.status)];
    if (!is_work) {
      bad.push_back(s.seconds);
      continue;
    }
    ++work;
    if (s.status == 429) {
      ++overloaded;
      continue;
    }
    (s.kind <= Kind::fill_mixed ? fills : chats).push_back(s.seconds);
    if (s.status == 200) documents += int64_t(s.documents);
  }
  int64_t lost = 0;
  for (const Sample& s : samples) lost += s.status == 0;
  int64_t malformed = 0;
  for (const auto& [why, n] : problems) malformed += n;
  malformed -= lost;
  std::optional<int64_t> rss_baseline;  // the last sample by --rss-baseline seconds
  for (const auto& [t, kib] : rss) {
    if (t <= o.rss_baseline + 0.5) rss_baseline = kib;
  }
  const double growth = rss_baseline && *rss_baseline > 0
                            ? double(rss_end - *rss_baseline) / double(*rss_baseline)
                            : 0;
  auto latency = [](const std::vector<double>& v) {
    return Json({{"count", v.size()},
                 {"p50_ms", 1000 * percentile(v, 0.50)},
                 {"p95_ms", 1000 * percentile(v, 0.95)},
                 {"p99_ms", 1000 * percentile(v, 0.99)}});
  };
  Json rss_series = Json::array();
  for (const auto& [t, kib] : rss) rss_series.push_back({std::lround(t), kib});
  const Json report = {{"model", o.model},
                       {"device", o.device},
                       {"clients", o.clients},
                       {"seconds", elapsed},
                       {"max_queue", o.max_queue},
                       {"requests", samples.size()},
                       {"requests_per_s", double(samples.size()) / elapsed},
                       {"documents_filled_per_s", double(documents) / elapsed},
                       {"lost", lost},
                       {"malformed", malformed},
                       {"overloaded_429", overloaded},
                       {"overloaded_rate", work ? double(overloaded) / double(work) : 0},
                       {"latency_all", latency(all)},
                       {"latency_fill", latency(fills)},
                       {"latency_chat", latency(chats)},
                       {"latency_bad", latency(bad)},
                       {"by_status", by_status},
                       {"problems", problems},
                       {"rss_kib", rss_series},
                       {"rss_baseline_kib", rss_baseline.value_or(0)},
                       {"rss_end_kib", rss_end},
                       {"rss_growth", growth},
                       {"clean_exit", clean_exit}};
  fmt::print("{}\n", report.dump(2));
  if (!o.json_out.empty()) std::ofstream(o.json_out) << report.dump(2) << "\n";
  const bool ok =
      lost == 0 && malformed == 0 && clean_exit && (elapsed < o.rss_baseline || growth <= 0.10);
  if (!ok) fmt::print(stderr, "serve_load_bench: FAILED\nserver log:\n{}\n", server.log);
  return ok ? 0 : 1;
}
