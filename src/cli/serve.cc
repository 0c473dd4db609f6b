// deg serve: the HTTP API (docs/serve.md) over one model, until SIGINT / SIGTERM.
#include <fmt/format.h>

#include "cli/commands.h"
#include "deg/engine.h"
#include "deg/error.h"
#include "deg/server.h"

namespace deg::cli {

void add_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "serve",
      "Serve deg's HTTP API: POST /v1/fill ({schema, documents, options} -> one report per\n"
      "document, as `deg fill --report`), POST /v1/plan, GET /v1/models, POST\n"
      "/v1/chat/completions (OpenAI-style, response_format json_schema; the last user message\n"
      "is the document; stream: true answers server-sent events), GET /healthz, GET /metrics\n"
      "(Prometheus), GET /openapi.json, and a playground page at / (open it in a browser).\n"
      "Fills take the engine in turn (requests waiting together share a call, whatever their\n"
      "schemas; answers do not change); more than --max-queue waiting answer 429. SIGINT /\n"
      "SIGTERM stop accepting, answer the requests in flight, and exit.\n"
      "docs/serve.md has a curl example per endpoint; `deg --log-level info serve` logs every\n"
      "request with its X-Request-Id.\n"
      "Example:\n"
      "  deg serve --model ckpt --port 8080 --api-key-file keys.txt");
  struct Opts {
    std::string model, base, device = "auto", gemm = "auto", api_key_file;
    ServerOptions server;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model,
                  "deg checkpoint directory (default: $DEG_MODEL, else the default model)");
  cmd->add_option("--base", o->base, "Base HF snapshot, when the checkpoint's deg.json base moved");
  add_device_option(cmd, o->device);
  add_gemm_option(cmd, o->gemm);
  cmd->add_option("--host", o->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->server.port, "Port to listen on (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key-file", o->api_key_file,
                  "File of API keys, one per line: every route but /healthz and / (the "
                  "playground) then needs \"Authorization: Bearer <key>\"")
      ->check(CLI::ExistingFile);
  cmd->add_option("--connections", o->server.threads, "Connections served at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--max-queue", o->server.max_queue,
                  "Fills that may wait for the engine; one more answers 429 with Retry-After")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  cmd->add_option("--max-body-bytes", o->server.max_body_bytes,
                  "Largest request body accepted (413 beyond)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 34));
  cmd->callback([o] {
    // Before any thread starts, so every thread inherits the mask and the signal reaches the
    // waiting one below instead of killing the process mid-request.
    termination_signals_block();
    if (!o->api_key_file.empty()) o->server.api_keys = api_keys_load(o->api_key_file);
    if (o->model.empty()) o->model = default_model().string();  // Engine::open explains none
    const Engine engine =
        Engine::open({.model = o->model, .base = o->base, .device = o->device, .gemm = o->gemm});
    // The model's id in /v1/models and chat answers: its directory's name.
    std::filesystem::path dir = std::filesystem::path(o->model).lexically_normal();
    if (dir.filename().empty()) dir = dir.parent_path();
    if (!dir.filename().empty()) o->server.model_name = dir.filename().string();
    Server server(engine, o->server);
    fmt::print(stderr, "deg: serving {} ({}) on http://{}:{}{}\n", o->model, engine.backbone_name(),
               o->server.host, server.port(),
               o->server.api_keys.empty() ? "" : " (API key required)");
    const int signal = termination_signal_wait();
    fmt::print(stderr, "deg: signal {}: answering the requests in flight, then exiting\n", signal);
    server.stop();
  });
}

}  // namespace deg::cli
