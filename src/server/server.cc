// deg's HTTP server (deg/server.h) on cpp-httplib. Every response carries X-Request-Id (the
// client's, when it sent a sane one, else a fresh one) and every log line names it; every error
// is {"error": {"message", "type", "code"}} with a status saying whose fault it is. Fills go
// through the Batcher (requests waiting together share engine calls, whatever their schemas); at
// most max_queue wait for the engine, more answer 429.
#include "deg/server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "deg/error.h"
#include "deg/input.h"
#include "deg/plan.h"
#include "deg/report.h"
#include "deg/runtime.h"
#include "server/batcher.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/openapi.h"
#include "server/playground.h"

namespace deg {

namespace {

using httplib::Request;
using httplib::Response;

constexpr const char* kRequestId = "X-Request-Id";
constexpr int64_t kMaxDeadlineMs = int64_t(24) * 3600 * 1000;  // a day
const std::vector<std::string> kRoutes = {
    "/",        "/v1/fill", "/v1/plan",     "/v1/models", "/v1/chat/completions",
    "/healthz", "/metrics", "/openapi.json"};

// An answer other than 200, thrown by a handler.
struct HttpError {
  int status;
  std::string code;  // machine-readable: invalid_json, unsupported_schema, ...
  std::string message;
  std::string pointer = {};  // into the request's schema, when one is at fault
};

const char* error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string dump(const OrderedJson& j) {
  return j.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

void reply_error(Response& res, const HttpError& e) {
  OrderedJson error = {{"message", e.message}, {"type", error_type(e.status)}, {"code", e.code}};
  if (!e.pointer.empty()) error["pointer"] = e.pointer;
  res.status = e.status;
  if (e.status == 429) res.set_header("Retry-After", "1");
  if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  res.set_content(dump({{"error", error}}), "application/json");
}

// A request id a client may choose: 1 to 128 characters of [A-Za-z0-9._:-].
bool request_id_ok(const std::string& id) {
  return !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
           c == '-';
  });
}

// Compares every byte of every key whatever matches, so the time taken says nothing about how
// much of a key a guess got right (only, at most, its length).
bool key_matches(std::string_view given, const std::vector<std::string>& keys) {
  unsigned matched = 0;
  for (const std::string& key : keys) {
    unsigned diff = given.size() != key.size() ? 1u : 0u;
    for (size_t i = 0; i < key.size(); ++i) {
      const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
      diff |= unsigned(g ^ static_cast<unsigned char>(key[i]));
    }
    matched |= diff == 0 ? 1u : 0u;
  }
  return matched != 0;
}

OrderedJson body_json(const Request& req) {
  try {
    OrderedJson body = json_parse_ordered(req.body, "request body");
    if (!body.is_object())
      throw HttpError{400, "invalid_request", "the request body must be a JSON object"};
    return body;
  } catch (const Error& e) {
    throw HttpError{400, "invalid_json", e.what()};
  }
}

// `schema` (the request's member `where`) checked: an object of at most kMaxSchemaBytes.
const OrderedJson& schema_member(const OrderedJson& schema, const std::string& where) {
  if (!schema.is_object()) {
    throw HttpError{400, "invalid_request", where + " must be a JSON Schema (an object)"};
  }
  if (int64_t(dump(schema).size()) > kMaxSchemaBytes) {
    throw HttpError{413, "schema_too_large",
                    fmt::format("{} is over {} bytes (docs/hardening.md)", where, kMaxSchemaBytes)};
  }
  return schema;
}

// A deg::Error from compiling or filling a schema: the schema's fault (422, naming the pointer),
// the request's (400), or ours (500).
HttpError from_error(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::unsupported:
    case ErrorKind::format: return {422, "unsupported_schema", e.what(), e.context().pointer};
    case ErrorKind::invalid_argument: return {400, "invalid_request", e.what()};
    default: return {500, "internal_error", e.what()};
  }
}

// The options of a /v1/fill request: the engine's, and how long it may wait for the engine.
struct RequestOptions {
  FillOptions fill;
  std::optional<int64_t> deadline_ms;
};

RequestOptions request_options(const OrderedJson& body) {
  RequestOptions out;
  const auto options = body.find("options");
  if (options == body.end() || options->is_null()) return out;
  if (!options->is_object()) throw HttpError{400, "invalid_request", "options must be an object"};
  for (const auto& [key, value] : options->items()) {
    if (key == "keep_nulls" && value.is_boolean()) {
      out.fill.keep_nulls = value.get<bool>();
    } else if (key == "min_confidence" && value.is_number() && value.get<double>() >= 0 &&
               value.get<double>() <= 1) {
      out.fill.min_confidence = value.get<double>();
    } else if (key == "deadline_ms" && value.is_number_integer() && value.get<int64_t>() >= 0 &&
               value.get<int64_t>() <= kMaxDeadlineMs) {
      out.deadline_ms = value.get<int64_t>();
    } else {
      throw HttpError{400, "invalid_request",
                      fmt::format("options.{}: the fill options are keep_nulls (true or false), "
                                  "min_confidence (a number in [0, 1]) and deadline_ms (an "
                                  "integer in [0, {}])",
                                  key, kMaxDeadlineMs)};
    }
  }
  return out;
}

}  // namespace

struct Server::Impl {
  Impl(const Engine& e, ServerOptions o) : engine(e), options(std::move(o)) {}

  const Engine& engine;
  const ServerOptions options;
  httplib::Server http;
  std::thread listener;
  int port = 0;
  server::Metrics metrics;
  server::Batcher batcher{engine, options.max_documents};
  const std::string playground = server::playground_page();
  std::atomic<int64_t> admitted{0};  // fills running or waiting for the engine
  std::mutex random_mutex;
  std::mt19937_64 random{std::random_device{}()};

  std::string fresh_request_id() {
    std::lock_guard lock(random_mutex);
    return fmt::format("{:016x}", random());
  }

  // Fills `docs` through the batcher; 429 when max_queue fills already wait for the engine.
  std::vector<FillResult> fill(const OrderedJson& schema, const std::vector<DocumentParts>& docs,
                               const RequestOptions& request) {
    if (admitted.fetch_add(1) > options.max_queue) {
      metrics.queue_depth(--admitted);
      throw HttpError{
          429, "overloaded",
          fmt::format("{} fills are waiting already; retry after a second", options.max_queue)};
    }
    struct Release {
      Impl& s;
      ~Release() { s.metrics.queue_depth(--s.admitted); }
    } release{*this};
    metrics.queue_depth(admitted.load());
    std::vector<FillResult> results;
    std::optional<server::Batcher::Clock::time_point> deadline;
    if (request.deadline_ms) {
      deadline = server::Batcher::Clock::now() + std::chrono::milliseconds(*request.deadline_ms);
    }
    try {
      results = batcher.fill(schema, docs, request.fill, deadline);
    } catch (const Error& e) {
      throw from_error(e);
    } catch (const server::Batcher::DeadlineExceeded&) {
      throw HttpError{504, "deadline_exceeded",
                      fmt::format("the request waited {} ms for the engine (options.deadline_ms) "
                                  "and was not filled; retry, or allow longer",
                                  *request.deadline_ms)};
    }
    const int64_t failed =
        std::count_if(results.begin(), results.end(), [](const FillResult& r) { return !r.ok(); });
    metrics.documents_done(int64_t(results.size()) - failed, failed);
    return results;
  }

  void fill_route(const Request& req, Response& res) {
    const OrderedJson body = body_json(req);
    if (!body.contains("schema")) throw HttpError{400, "invalid_request", "schema is missing"};
    const OrderedJson& schema = schema_member(body["schema"], "schema");
    const auto documents = body.find("documents");
    if (documents == body.end() || !documents->is_array() || documents->empty()) {
      throw HttpError{400, "invalid_request",
                      "documents must be a non-empty array of documents (strings, {\"document\": "
                      "...} or {\"parts\": [...]})"};
    }
    if (int64_t(documents->size()) > options.max_documents) {
      throw HttpError{413, "too_many_documents",
                      fmt::format("{} documents; a request holds at most {} (send several)",
                                  documents->size(), options.max_documents)};
    }
    const RequestOptions options_of_request = request_options(body);
    // A document that cannot be read fails alone, in its place; file parts are refused (empty
    // PartsAccess root): a client names no files on the server.
    std::vector<DocumentParts> readable;
    std::vector<std::string> unreadable(documents->size());
    for (size_t i = 0; i < documents->size(); ++i) {
      try {
        readable.push_back(document_from_json(Json::parse(dump((*documents)[i])), PartsAccess{},
                                              options.limits, fmt::format("documents[{}]", i)));
      } catch (const Error& e) {
        unreadable[i] = e.what();
      }
    }
    const std::vector<FillResult> filled = fill(schema, readable, options_of_request);
    OrderedJson results = OrderedJson::array();
    for (size_t i = 0, k = 0; i < unreadable.size(); ++i) {
      results.push_back(
          report_to_json(unreadable[i].empty() ? filled[k++] : FillResult{.error = unreadable[i]}));
    }
    res.set_content(dump({{"results", results}}), "application/json");
  }

  void plan_route(const Request& req, Response& res) {
    const OrderedJson body = body_json(req);
    if (!body.contains("schema")) throw HttpError{400, "invalid_request", "schema is missing"};
    const OrderedJson& schema = schema_member(body["schema"], "schema");
    ArrayMode mode = ArrayMode::anchor;
    if (const auto o = body.find("options"); o != body.end() && !o->is_null()) {
      const std::string m = o->is_object() ? o->value("array_mode", "anchor") : "";
      if (m != "anchor" && m != "index") {
        throw HttpError{400, "invalid_request",
                        "options must be {\"array_mode\": \"anchor\" | \"index\"}"};
      }
      mode = m == "index" ? ArrayMode::index : ArrayMode::anchor;
    }
    PlanSummary plan;
    try {
      plan = plan_describe(schema, mode);
    } catch (const Error& e) {
      throw from_error(e);
    }
    OrderedJson out = plan.json;
    out["max_units"] = plan.max_units;
    out["queries"] = plan.queries;
    out["text"] = plan.text;
    res.set_content(dump(out), "application/json");
  }

  void chat_route(const Request& req, Response& res) {
    server::ChatRequest chat;
    try {
      chat = server::chat_request_parse(body_json(req));
    } catch (const Error& e) {
      throw HttpError{400, "invalid_request", e.message()};
    }
    schema_member(chat.schema, "response_format.json_schema.schema");
    if (int64_t(chat.document.size()) > options.limits.document_bytes) {
      throw HttpError{413, "document_too_large",
                      fmt::format("the document (the last user message) is over {} bytes",
                                  options.limits.document_bytes)};
    }
    const std::vector<FillResult> filled =
        fill(chat.schema, {DocumentParts{DocumentPart::of_text(std::move(chat.document))}}, {});
    if (!filled[0].ok()) {
      throw HttpError{400, "invalid_document", "the last user message: " + filled[0].error};
    }
    const server::ChatAnswer answer{.id = "chatcmpl-" + res.get_header_value(kRequestId),
                                    .model = options.model_name,
                                    .created = int64_t(std::time(nullptr)),
                                    .content = dump(filled[0].value)};
    if (chat.stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_content(server::chat_completion_events(answer), "text/event-stream");
    } else {
      res.set_content(dump(server::chat_completion(answer)), "application/json");
    }
  }

  void models_route(const Request&, Response& res) {
    const OrderedJson model = {{"id", options.model_name},
                               {"object", "model"},
                               {"created", 0},
                               {"owned_by", "deg"},
                               {"backbone", engine.backbone_name()}};
    res.set_content(dump({{"object", "list"}, {"data", {model}}}), "application/json");
  }

  // Runs a route: authentication, then the handler; whatever it throws becomes its error answer.
  httplib::Server::Handler route(void (Impl::*handler)(const Request&, Response&),
                                 bool open = false) {
    return [this, handler, open](const Request& req, Response& res) {
      const auto start = std::chrono::steady_clock::now();
      try {
        if (!open && !options.api_keys.empty()) {
          const std::string auth = req.get_header_value("Authorization");
          if (!auth.starts_with("Bearer ") ||
              !key_matches(std::string_view(auth).substr(7), options.api_keys)) {
            throw HttpError{401, "invalid_api_key",
                            "this server needs an API key: send \"Authorization: Bearer <key>\""};
          }
        }
        (this->*handler)(req, res);
      } catch (const HttpError& e) {
        reply_error(res, e);
      } catch (const std::bad_alloc&) {
        reply_error(res, {503, "out_of_memory", "the server ran out of memory for this request"});
      } catch (const std::exception& e) {
        log_error(fmt::format("[{}] {} {}: {}", res.get_header_value(kRequestId), req.method,
                              req.path, e.what()));
        reply_error(res, {500, "internal_error", e.what()});
      }
      metrics.latency(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    };
  }

  void setup() {
    http.new_task_queue = [n = options.threads] { return new httplib::ThreadPool(size_t(n)); };
    http.set_payload_max_length(size_t(options.max_body_bytes));
    http.set_read_timeout(time_t(options.io_timeout_seconds));
    http.set_write_timeout(time_t(options.io_timeout_seconds));
    http.set_keep_alive_timeout(2);
    // SO_REUSEADDR only (httplib's default adds SO_REUSEPORT where it exists): a second server
    // on a port in use must fail to bind, not share the port.
    http.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    http.set_pre_routing_handler([this](const Request& req, Response& res) {
      const std::string id = req.get_header_value(kRequestId);
      res.set_header(kRequestId, request_id_ok(id) ? id : fresh_request_id());
      return httplib::Server::HandlerResponse::Unhandled;
    });
    // Errors httplib answers itself (no route, a body over the limit, a broken request line).
    http.set_error_handler(
        httplib::Server::HandlerWithResponse([this](const Request& req, Response& res) {
          if (!res.has_header(kRequestId)) res.set_header(kRequestId, fresh_request_id());
          if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
          if (res.status == 404) {
            reply_error(res, {404, "route_not_found",
                              fmt::format("no route {} {}; the routes are in GET /openapi.json",
                                          req.method, req.path)});
          } else if (res.status == 413) {
            reply_error(res,
                        {413, "body_too_large",
                         fmt::format("the request body is over {} bytes", options.max_body_bytes)});
          } else {
            reply_error(res, {res.status, "bad_request", "the HTTP request could not be read"});
          }
          return httplib::Server::HandlerResponse::Handled;
        }));
    // Counted and logged before the answer is written, so a client that has its answer finds
    // it in /metrics and in the log.
    http.set_post_routing_handler([this](const Request& req, Response& res) {
      const bool known = std::find(kRoutes.begin(), kRoutes.end(), req.path) != kRoutes.end();
      metrics.request_done(known ? req.path : "other", res.status);
      log_info(fmt::format("[{}] {} {} {} ({} bytes)", res.get_header_value(kRequestId), req.method,
                           req.path, res.status, res.body.size()));
    });
    http.Post("/v1/fill", route(&Impl::fill_route));
    http.Post("/v1/plan", route(&Impl::plan_route));
    http.Post("/v1/chat/completions", route(&Impl::chat_route));
    http.Get("/v1/models", route(&Impl::models_route));
    http.Get("/", route(&Impl::playground_route, /*open=*/true));
    http.Get("/healthz", route(&Impl::healthz_route, /*open=*/true));
    http.Get("/metrics", route(&Impl::metrics_route));
    http.Get("/openapi.json", route(&Impl::openapi_route));
  }

  // Open like /healthz: a browser sends no key when it opens a page; the page asks for one and
  // sends it with its fills. It loads nothing from elsewhere, and the policy says so.
  void playground_route(const Request&, Response& res) {
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                   "connect-src 'self'");
    res.set_content(playground, "text/html; charset=utf-8");
  }
  void healthz_route(const Request&, Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  }
  void metrics_route(const Request&, Response& res) {
    res.set_content(metrics.text(batcher.engine_calls()), "text/plain; version=0.0.4");
  }
  void openapi_route(const Request&, Response& res) {
    res.set_content(std::string(server::openapi_document()), "application/json");
  }
};

Server::Server(const Engine& engine, ServerOptions options) {
  if (options.port < 0 || options.port > 65535) {
    throw Error(
        ErrorKind::invalid_argument,
        fmt::format("--port must be in [0, 65535] (0: any free port), got {}", options.port));
  }
  if (options.threads < 1 || options.max_queue < 0 || options.max_body_bytes < 1 ||
      options.max_documents < 1 || options.io_timeout_seconds < 1) {
    throw Error(ErrorKind::invalid_argument,
                "server options: threads, max_body_bytes, max_documents and io_timeout_seconds "
                "must be at least 1, max_queue at least 0");
  }
  impl_ = std::make_unique<Impl>(engine, std::move(options));
  Impl& s = *impl_;
  s.setup();
  const std::string& host = s.options.host;
  s.port = s.options.port == 0 ? s.http.bind_to_any_port(host)
                               : (s.http.bind_to_port(host, s.options.port) ? s.options.port : -1);
  if (s.port < 0) {
    throw Error(ErrorKind::io,
                fmt::format("cannot listen on {}:{}: the address is in use or not this machine's; "
                            "pick another --host / --port",
                            host, s.options.port));
  }
  s.listener = std::thread([&s] { s.http.listen_after_bind(); });
  // httplib's stop() does nothing until its loop runs: wait for it, so stop() always stops.
  while (!s.http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

Server::~Server() {
  stop();
}

int Server::port() const {
  return impl_->port;
}

void Server::stop() {
  if (!impl_ || !impl_->listener.joinable()) return;
  impl_->http.stop();
  impl_->listener.join();  // the pool's threads finish the requests in flight first
}

std::vector<std::string> api_keys_load(const std::filesystem::path& path) {
  const std::string text = document_read(path);
  std::vector<std::string> keys;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    std::string line = text.substr(begin, end - begin);
    const size_t first = line.find_first_not_of(" \t\r");
    if (first != std::string::npos) {
      keys.push_back(line.substr(first, line.find_last_not_of(" \t\r") - first + 1));
    }
    begin = end + 1;
  }
  if (keys.empty()) {
    throw Error(ErrorKind::invalid_argument, "the API key file holds no key (one per line)",
                {.path = path.string()});
  }
  return keys;
}

namespace {

sigset_t termination_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void termination_signals_block() {
  const sigset_t set = termination_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int termination_signal_wait() {
  const sigset_t set = termination_signals();
  int signal = 0;
  sigwait(&set, &signal);
  return signal;
}

}  // namespace deg
