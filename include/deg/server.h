// `deg serve`: deg's HTTP API (docs/serve.md) over one Engine — /v1/fill, /v1/plan, /v1/models,
// OpenAI-style /v1/chat/completions with response_format json_schema, /healthz, /metrics,
// /openapi.json, and the playground page at /. Requests are answered on a pool of connection
// threads; fills take the engine in turn, all requests waiting together sharing one engine call
// whatever their schemas (answers bitwise the same as alone), and more than
// ServerOptions::max_queue waiting fills answer 429.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "deg/engine.h"

namespace deg {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (Server::port() says which)
  // Non-empty: every route but /healthz and / (the playground page) needs "Authorization:
  // Bearer <one of them>".
  std::vector<std::string> api_keys;
  std::string model_name = "deg";  // the model id /v1/models and chat completions report
  int64_t max_body_bytes = int64_t(64) << 20;  // 64 MiB: a bigger request body answers 413
  int64_t max_documents = 1024;                // documents of one /v1/fill request (413 beyond)
  InputLimits limits;      // per document: over them it fails alone (chat completions: 413)
  int64_t max_queue = 64;  // fills waiting for the engine; one more answers 429 + Retry-After
  int threads = 8;         // connections served at once
  int64_t io_timeout_seconds = 30;  // a client that stops sending or reading is dropped
};

class Server {
 public:
  // Binds host:port and starts serving on background threads; `engine` must outlive the server.
  // Throws deg::Error when the address cannot be bound or an option is out of range.
  Server(const Engine& engine, ServerOptions options);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  // Stops accepting connections; returns once the requests in flight have been answered.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The keys of an API key file: one per line, surrounding whitespace and empty lines ignored.
// Throws deg::Error when the file cannot be read or holds no key.
std::vector<std::string> api_keys_load(const std::filesystem::path& path);

// SIGINT / SIGTERM: block them in the calling thread (and every thread it starts afterwards:
// call this first), then wait for one; returns its number.
void termination_signals_block();
int termination_signal_wait();

}  // namespace deg
