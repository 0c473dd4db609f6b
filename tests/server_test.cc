// `deg serve` in-process on an ephemeral loopback port, over a tiny random Qwen3.5 with fresh
// heads: every endpoint's answer and error codes, authentication, request ids, the OpenAI shapes
// (plain and SSE), metrics, overload, and that a fill over HTTP is bitwise the library's fill.
// The fill report format (docs/report.schema.json) is checked here too, on real reports.
#include "deg/server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "deg/error.h"
#include "deg/plan.h"
#include "deg/report.h"
#include "deg/runtime.h"
#include "io/json.h"
#include "model/checkpoint.h"
#include "schema/validate.h"
#include "test_util.h"
#include "text/unicode.h"
#include "tiny_model.h"

namespace deg {
namespace {

namespace fs = std::filesystem;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    runtime_setup({.log_level = "warn"});
    dir_ = new testing::TempDir();
    testing::write_tiny_qwen35(*dir_ / "base", 11);
    checkpoint_init({.base = *dir_ / "base", .out = *dir_ / "ckpt", .seed = 3});
    engine_ = new Engine(Engine::open({.model = *dir_ / "ckpt"}));
    server_ = new Server(*engine_, {.port = 0, .model_name = "tiny"});
  }
  static void TearDownTestSuite() {
    delete server_;
    delete engine_;
    delete dir_;
  }

  static httplib::Client client(const Server& server = *server_) {
    httplib::Client c("127.0.0.1", server.port());
    // Generous: under the sanitizers on a loaded 2-core machine a request can wait behind fills of
    // long documents for over a minute (ctest's own timeout still bounds a hung server).
    c.set_read_timeout(300);
    return c;
  }
  static OrderedJson invoice_schema() {
    return schema_load(testing::source_path("examples/invoice.schema.json").string());
  }
  static std::vector<std::string> documents() {
    return {testing::read_text(testing::source_path("examples/invoice.txt")),
            "Invoice INV-7 from Acme GmbH, total 12.50 EUR, due 2026-01-31."};
  }
  // POST path body; returns (status, parsed body, response).
  static httplib::Result post(const std::string& path, const std::string& body,
                              const Server& server = *server_) {
    return client(server).Post(path.c_str(), body, "application/json");
  }
  static OrderedJson error_of(const httplib::Result& r) {
    const OrderedJson j = OrderedJson::parse(r->body);
    EXPECT_TRUE(j.contains("error")) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << r->body;
    EXPECT_TRUE(j["error"]["type"].is_string()) << r->body;
    EXPECT_TRUE(j["error"]["code"].is_string()) << r->body;
    return j["error"];
  }

  static testing::TempDir* dir_;
  static Engine* engine_;
  static Server* server_;
};

testing::TempDir* ServerTest::dir_ = nullptr;
Engine* ServerTest::engine_ = nullptr;
Server* ServerTest::server_ = nullptr;

TEST_F(ServerTest, HealthzAnswersWithARequestId) {
  auto r = client().Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(OrderedJson::parse(r->body)["status"], "ok");
  const std::string id = r->get_header_value("X-Request-Id");
  EXPECT_EQ(id.size(), 16u) << id;
  auto again = client().Get("/healthz");
  EXPECT_NE(again->get_header_value("X-Request-Id"), id);
}

TEST_F(ServerTest, RequestIdsAreEchoedWhenSane) {
  auto r = client().Get("/v1/models", {{"X-Request-Id", "client-42.a:b_c"}});
  EXPECT_EQ(r->get_header_value("X-Request-Id"), "client-42.a:b_c");
  // An error answer carries it too.
  auto e = client().Get("/nowhere", {{"X-Request-Id", "trace-7"}});
  EXPECT_EQ(e->status, 404);
  EXPECT_EQ(e->get_header_value("X-Request-Id"), "trace-7");
  // Not echoed: spaces, or longer than 128 characters; a fresh one replaces it.
  for (const std::string& bad : {std::string("has space"), std::string(129, 'a')}) {
    auto b = client().Get("/healthz", {{"X-Request-Id", bad}});
    EXPECT_NE(b->get_header_value("X-Request-Id"), bad);
    EXPECT_EQ(b->get_header_value("X-Request-Id").size(), 16u);
  }
}

TEST_F(ServerTest, LogLinesNameTheRequestId) {
  runtime_setup({.log_level = "info"});
  ::testing::internal::CaptureStderr();
  client().Get("/healthz", {{"X-Request-Id", "log-test-1"}});
  client().Get("/nowhere", {{"X-Request-Id", "log-test-2"}});
  const std::string log = ::testing::internal::GetCapturedStderr();
  runtime_setup({.log_level = "warn"});
  EXPECT_NE(log.find("[log-test-1] GET /healthz 200"), std::string::npos) << log;
  EXPECT_NE(log.find("[log-test-2] GET /nowhere 404"), std::string::npos) << log;
}

TEST_F(ServerTest, FillIsBitwiseTheLibrarysFill) {
  const OrderedJson schema = invoice_schema();
  const OrderedJson body = {
      {"schema", schema}, {"documents", documents()}, {"options", {{"keep_nulls", true}}}};
  auto r = post("/v1/fill", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  const OrderedJson results = OrderedJson::parse(r->body)["results"];
  const std::vector<FillResult> direct = engine_->fill(schema, documents(), {.keep_nulls = true});
  ASSERT_EQ(results.size(), direct.size());
  for (size_t d = 0; d < direct.size(); ++d) {
    EXPECT_EQ(results[d], report_to_json(direct[d])) << d;
    ASSERT_EQ(results[d]["fields"].size(), direct[d].fields.size());
    ASSERT_FALSE(direct[d].fields.empty());
    for (size_t i = 0; i < direct[d].fields.size(); ++i) {
      // Doubles survive the JSON text exactly: compare the bits.
      const double c = results[d]["fields"][i]["confidence"].get<double>();
      EXPECT_EQ(std::memcmp(&c, &direct[d].fields[i].confidence, sizeof c), 0)
          << direct[d].fields[i].path;
    }
  }
}

TEST_F(ServerTest, ReportsValidateAgainstTheDocumentedSchema) {
  const OrderedJson report_schema =
      schema_load(testing::source_path("docs/report.schema.json").string());
  const OrderedJson body = {{"schema", invoice_schema()},
                            {"documents", {documents()[0], ""}},
                            {"options", {{"min_confidence", 0.5}}}};
  auto r = post("/v1/fill", body.dump());
  ASSERT_EQ(r->status, 200) << r->body;
  const OrderedJson results = OrderedJson::parse(r->body)["results"];
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0]["version"], kReportVersion);
  EXPECT_TRUE(results[0].contains("fields"));
  EXPECT_TRUE(results[1].contains("error"));  // the empty document failed alone
  for (const OrderedJson& report : results) {
    const auto why = schema::schema_violations(report_schema, report);
    EXPECT_TRUE(why.empty()) << report.dump() << "\n" << fmt::format("{}", fmt::join(why, "; "));
  }
  // The schema can fail: another version, a kind it does not know, a span of one number.
  for (const auto& [pointer, value] : std::vector<std::pair<std::string, OrderedJson>>{
           {"/version", 2}, {"/fields/0/kind", "object"}, {"/fields/0/span", {1}}}) {
    OrderedJson broken = results[0];
    broken[OrderedJson::json_pointer(pointer)] = value;
    EXPECT_FALSE(schema::schema_violations(report_schema, broken).empty()) << pointer;
  }
}

TEST_F(ServerTest, FillErrorsHaveTheirStatus) {
  const std::string schema = invoice_schema().dump();
  struct Case {
    std::string body;
    int status;
    std::string code;
  };
  const std::vector<Case> cases = {
      {"{\"schema\": ", 400, "invalid_json"},
      {"[1, 2]", 400, "invalid_request"},
      {"{\"schema\": {\"type\": \"object\"}, \"documents\": [\"a\", \"\xff\"]}", 400,
       "invalid_json"},  // invalid UTF-8
      {std::string(100000, '[') + std::string(100000, ']'), 400, "invalid_json"},
      {"{\"documents\": [\"x\"]}", 400, "invalid_request"},
      {"{\"schema\": " + schema + ", \"documents\": []}", 400, "invalid_request"},
      {"{\"schema\": " + schema + ", \"documents\": \"x\"}", 400, "invalid_request"},
      {"{\"schema\": " + schema + ", \"documents\": [\"x\"], \"options\": {\"keep\": 1}}", 400,
       "invalid_request"},
      {"{\"schema\": " + schema + ", \"documents\": [\"x\"], \"options\": {\"min_confidence\": 2}}",
       400, "invalid_request"},
      {"{\"schema\": " + schema + ", \"documents\": [\"x\"], \"options\": {\"deadline_ms\": -1}}",
       400, "invalid_request"},
  };
  for (const Case& c : cases) {
    auto r = post("/v1/fill", c.body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, c.status) << c.body.substr(0, 80) << "\n" << r->body;
    EXPECT_EQ(error_of(r)["code"], c.code) << r->body;
  }
  // An unsupported schema: 422 naming the JSON pointer of the part at fault.
  const OrderedJson bad = {
      {"type", "object"},
      {"properties", {{"a", {{"type", "object"}, {"patternProperties", {{"x", {}}}}}}}}};
  auto r = post("/v1/fill", OrderedJson({{"schema", bad}, {"documents", {"text"}}}).dump());
  EXPECT_EQ(r->status, 422) << r->body;
  const OrderedJson e = error_of(r);
  EXPECT_EQ(e["code"], "unsupported_schema");
  EXPECT_EQ(e["pointer"], "/properties/a/patternProperties") << e.dump();
  // The server still serves.
  EXPECT_EQ(client().Get("/healthz")->status, 200);
}

TEST_F(ServerTest, UnknownRoutesAre404) {
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v2/fill"}, {"GET", "/v1/fill"}, {"POST", "/healthz"}}) {
    auto r = method == "GET" ? client().Get(path.c_str())
                             : client().Post(path.c_str(), "{}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404) << method << " " << path;
    EXPECT_EQ(error_of(r)["code"], "route_not_found");
  }
}

TEST_F(ServerTest, PlanAnswersThePlanOrTheRejection) {
  const OrderedJson schema = invoice_schema();
  auto r = post("/v1/plan", OrderedJson({{"schema", schema}}).dump());
  ASSERT_EQ(r->status, 200) << r->body;
  const OrderedJson plan = OrderedJson::parse(r->body);
  const PlanSummary direct = plan_describe(schema);
  EXPECT_EQ(plan["fields"], direct.json["fields"]);
  EXPECT_EQ(plan["units"], direct.units);
  EXPECT_EQ(plan["queries"], direct.queries);
  EXPECT_EQ(plan["text"], direct.text);
  auto index = post(
      "/v1/plan", OrderedJson({{"schema", schema}, {"options", {{"array_mode", "index"}}}}).dump());
  ASSERT_EQ(index->status, 200);
  EXPECT_EQ(OrderedJson::parse(index->body)["fields"],
            plan_describe(schema, ArrayMode::index).json["fields"]);
  auto mode =
      post("/v1/plan",
           OrderedJson({{"schema", schema}, {"options", {{"array_mode", "sideways"}}}}).dump());
  EXPECT_EQ(mode->status, 400);
  auto bad =
      post("/v1/plan", R"({"schema": {"type": "object", "properties": {"n": {"not": {}}}}})");
  EXPECT_EQ(bad->status, 422) << bad->body;
  EXPECT_EQ(error_of(bad)["pointer"], "/properties/n/not");
}

TEST_F(ServerTest, ModelsListsTheServedModel) {
  auto r = client().Get("/v1/models");
  ASSERT_EQ(r->status, 200);
  const OrderedJson j = OrderedJson::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["backbone"], engine_->backbone_name());
}

OrderedJson chat_body(const OrderedJson& schema, const std::string& document, bool stream) {
  return {{"model", "tiny"},
          {"messages",
           {{{"role", "system"}, {"content", "Extract the invoice."}},
            {{"role", "user"}, {"content", "ignored: not the last user message"}},
            {{"role", "assistant"}, {"content", "ok"}},
            {{"role", "user"}, {"content", {{{"type", "text"}, {"text", document}}}}}}},
          {"response_format",
           {{"type", "json_schema"}, {"json_schema", {{"name", "invoice"}, {"schema", schema}}}}},
          {"stream", stream}};
}

TEST_F(ServerTest, ChatCompletionsAnswerInOpenAIsShape) {
  const OrderedJson schema = invoice_schema();
  auto r = post("/v1/chat/completions", chat_body(schema, documents()[1], false).dump());
  ASSERT_EQ(r->status, 200) << r->body;
  const OrderedJson j = OrderedJson::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"], "chatcmpl-" + r->get_header_value("X-Request-Id"));
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_TRUE(j["created"].is_number_integer());
  ASSERT_EQ(j["choices"].size(), 1u);
  const OrderedJson& choice = j["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(OrderedJson::parse(choice["message"]["content"].get<std::string>()),
            engine_->fill(schema, {documents()[1]})[0].value);
}

TEST_F(ServerTest, ChatCompletionsStreamAsServerSentEvents) {
  const OrderedJson schema = invoice_schema();
  auto plain = post("/v1/chat/completions", chat_body(schema, documents()[1], false).dump());
  auto r = post("/v1/chat/completions", chat_body(schema, documents()[1], true).dump());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  // Events are "data: <json>\n\n", the last "data: [DONE]".
  std::vector<std::string> events;
  size_t at = 0;
  while (at < r->body.size()) {
    const size_t end = r->body.find("\n\n", at);
    ASSERT_NE(end, std::string::npos) << r->body.substr(at);
    ASSERT_EQ(r->body.compare(at, 6, "data: "), 0) << r->body.substr(at);
    events.push_back(r->body.substr(at + 6, end - at - 6));
    at = end + 2;
  }
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string content;
  std::string finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const OrderedJson chunk = OrderedJson::parse(events[i]);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    EXPECT_EQ(chunk["id"], "chatcmpl-" + r->get_header_value("X-Request-Id"));
    const OrderedJson& choice = chunk["choices"][0];
    if (i == 0) {
      EXPECT_EQ(choice["delta"]["role"], "assistant");
    }
    content += choice["delta"].value("content", "");
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(content,
            OrderedJson::parse(plain->body)["choices"][0]["message"]["content"].get<std::string>());
}

// The official `openai` JavaScript client (scripts/fetch-test-data puts it in .cache/npm),
// unchanged, gets the structured answer plain and streamed.
TEST_F(ServerTest, OpenAiClientGetsStructuredAnswers) {
  const fs::path package = testing::source_path(".cache/npm/openai");
  ASSERT_TRUE(fs::exists(package / "package.json")) << "run scripts/fetch-test-data";
  Server guarded(*engine_, {.port = 0, .api_keys = {"sdk-key"}, .model_name = "tiny"});
  const std::string document = documents()[1];
  testing::write_text(*dir_ / "sdk-document.txt", document);
  const std::string cmd =
      fmt::format("node '{}' '{}' 'http://127.0.0.1:{}/v1' sdk-key '{}' '{}' > '{}' 2>&1",
                  testing::source_path("tests/openai_client.cjs").string(), package.string(),
                  guarded.port(), testing::source_path("examples/invoice.schema.json").string(),
                  (*dir_ / "sdk-document.txt").string(), (*dir_ / "sdk-out.txt").string());
  const int status = std::system(cmd.c_str());
  const std::string out = testing::read_text(*dir_ / "sdk-out.txt");
  ASSERT_EQ(status, 0) << out;
  const OrderedJson answer = OrderedJson::parse(out);
  const OrderedJson expected = engine_->fill(invoice_schema(), {document})[0].value;
  EXPECT_EQ(OrderedJson::parse(answer["plain"].get<std::string>()), expected) << out;
  EXPECT_EQ(answer["streamed"], answer["plain"]);
  EXPECT_EQ(answer["finish_reason"], "stop");
  EXPECT_EQ(answer["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
}

TEST_F(ServerTest, ChatCompletionsSayWhatTheyNeed) {
  const OrderedJson schema = invoice_schema();
  OrderedJson no_format = chat_body(schema, "text", false);
  no_format.erase("response_format");
  OrderedJson json_object = chat_body(schema, "text", false);
  json_object["response_format"] = {{"type", "json_object"}};
  OrderedJson no_user = chat_body(schema, "text", false);
  no_user["messages"] = {{{"role", "system"}, {"content", "hi"}}};
  OrderedJson image = chat_body(schema, "text", false);
  image["messages"][3]["content"] = {{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}};
  for (const OrderedJson& body : {no_format, json_object, no_user, image}) {
    auto r = post("/v1/chat/completions", body.dump());
    EXPECT_EQ(r->status, 400) << body.dump();
    EXPECT_EQ(error_of(r)["type"], "invalid_request_error");
  }
  auto empty = post("/v1/chat/completions", chat_body(schema, "", false).dump());
  EXPECT_EQ(empty->status, 400) << empty->body;
  EXPECT_EQ(error_of(empty)["code"], "invalid_document");
}

TEST_F(ServerTest, LimitsAnswer413) {
  Server small(
      *engine_,
      {.port = 0, .max_body_bytes = 20000, .max_documents = 2, .limits = {.document_bytes = 64}});
  const std::string schema = invoice_schema().dump();
  auto body = post("/v1/fill", std::string(30000, ' '), small);
  ASSERT_TRUE(body);
  EXPECT_EQ(body->status, 413);
  EXPECT_EQ(error_of(body)["code"], "body_too_large");
  auto many = post(
      "/v1/fill",
      OrderedJson({{"schema", invoice_schema()}, {"documents", {"a", "b", "c"}}}).dump(), small);
  EXPECT_EQ(many->status, 413);
  EXPECT_EQ(error_of(many)["code"], "too_many_documents");
  // /v1/fill: a document over the limit fails alone; chat: the one document answers 413.
  auto fill =
      post("/v1/fill",
           OrderedJson({{"schema", invoice_schema()}, {"documents", {std::string(65, 'x'), "ok"}}})
               .dump(),
           small);
  ASSERT_EQ(fill->status, 200) << fill->body;
  const OrderedJson results = OrderedJson::parse(fill->body)["results"];
  EXPECT_TRUE(results[0].contains("error"));
  EXPECT_TRUE(results[1].contains("value"));
  auto chat = post("/v1/chat/completions",
                   chat_body(invoice_schema(), std::string(65, 'x'), false).dump(), small);
  EXPECT_EQ(chat->status, 413);
  EXPECT_EQ(error_of(chat)["code"], "document_too_large");
  EXPECT_EQ(client(small).Get("/healthz")->status, 200);
  // A schema over kMaxSchemaBytes, in a body within the default limit.
  OrderedJson huge = invoice_schema();
  huge["description"] = std::string(size_t(kMaxSchemaBytes), 'd');
  auto big = post("/v1/fill", OrderedJson({{"schema", huge}, {"documents", {"x"}}}).dump());
  EXPECT_EQ(big->status, 413);
  EXPECT_EQ(error_of(big)["code"], "schema_too_large");
}

TEST_F(ServerTest, ApiKeysGuardEveryRouteButHealthz) {
  Server guarded(*engine_, {.port = 0, .api_keys = {"first-key", "second-key"}});
  httplib::Client c = client(guarded);
  for (const httplib::Headers& h :
       std::vector<httplib::Headers>{{},
                                     {{"Authorization", "Bearer wrong"}},
                                     {{"Authorization", "Bearer first-ke"}},
                                     {{"Authorization", "first-key"}},
                                     {{"Authorization", "Bearer first-key2"}}}) {
    auto r = c.Get("/v1/models", h);
    EXPECT_EQ(r->status, 401);
    EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
    EXPECT_EQ(error_of(r)["type"], "authentication_error");
  }
  EXPECT_EQ(c.Get("/metrics")->status, 401);
  EXPECT_EQ(c.Post("/v1/plan", "{}", "application/json")->status, 401);
  EXPECT_EQ(c.Get("/healthz")->status, 200);
  EXPECT_EQ(c.Get("/")->status, 200);  // the page; its fills send the key
  for (const char* key : {"first-key", "second-key"}) {
    EXPECT_EQ(c.Get("/v1/models", {{"Authorization", std::string("Bearer ") + key}})->status, 200)
        << key;
  }
  // Without keys, no header is needed (the shared server).
  EXPECT_EQ(client().Get("/v1/models")->status, 200);
}

TEST_F(ServerTest, ApiKeyFilesHoldOneKeyPerLine) {
  testing::write_text(*dir_ / "keys.txt", "  alpha \n\n\tbeta\r\n");
  EXPECT_EQ(api_keys_load(*dir_ / "keys.txt"), (std::vector<std::string>{"alpha", "beta"}));
  testing::write_text(*dir_ / "empty.txt", " \n\n");
  EXPECT_THROW(api_keys_load(*dir_ / "empty.txt"), Error);
  EXPECT_THROW(api_keys_load(*dir_ / "absent.txt"), Error);
}

TEST_F(ServerTest, MetricsCountRequestsErrorsAndDocuments) {
  Server fresh(*engine_, {.port = 0});
  httplib::Client c = client(fresh);
  c.Get("/healthz");
  c.Get("/healthz");
  c.Get("/missing");
  c.Post("/v1/fill",
         OrderedJson({{"schema", invoice_schema()}, {"documents", {"a text", ""}}}).dump(),
         "application/json");
  auto r = c.Get("/metrics");
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  const std::string& m = r->body;
  for (const char* line : {
           "deg_http_requests_total{route=\"/healthz\",code=\"200\"} 2\n",
           "deg_http_requests_total{route=\"other\",code=\"404\"} 1\n",
           "deg_http_requests_total{route=\"/v1/fill\",code=\"200\"} 1\n",
           "deg_http_errors_total{code=\"404\"} 1\n",
           "deg_documents_filled_total 1\n",
           "deg_documents_failed_total 1\n",
           "deg_fill_queue_depth 0\n",
           // Three requests ran a handler: the two health checks and the fill.
           "deg_http_request_duration_seconds_bucket{le=\"+Inf\"} 3\n",
           "deg_http_request_duration_seconds_count 3\n",
           "# TYPE deg_http_request_duration_seconds histogram\n",
       }) {
    EXPECT_NE(m.find(line), std::string::npos) << line << "\n" << m;
  }
}

TEST_F(ServerTest, OpenApiDescribesEveryRoute) {
  auto r = client().Get("/openapi.json");
  ASSERT_EQ(r->status, 200);
  const OrderedJson doc = OrderedJson::parse(r->body);
  EXPECT_EQ(doc["openapi"].get<std::string>().substr(0, 2), "3.");
  for (const auto& [path, method] :
       std::vector<std::pair<std::string, std::string>>{{"/", "get"},
                                                        {"/v1/fill", "post"},
                                                        {"/v1/plan", "post"},
                                                        {"/v1/models", "get"},
                                                        {"/v1/chat/completions", "post"},
                                                        {"/healthz", "get"},
                                                        {"/metrics", "get"},
                                                        {"/openapi.json", "get"}}) {
    EXPECT_TRUE(doc["paths"].contains(path) && doc["paths"][path].contains(method)) << path;
  }
  // Every $ref points at a component that exists.
  std::function<void(const OrderedJson&)> refs = [&](const OrderedJson& j) {
    if (j.is_object()) {
      if (j.contains("$ref")) {
        const std::string ref = j["$ref"];
        ASSERT_EQ(ref.rfind("#/", 0), 0u) << ref;
        EXPECT_TRUE(doc.contains(OrderedJson::json_pointer(ref.substr(1)))) << ref;
      }
      for (const auto& [k, v] : j.items()) refs(v);
    } else if (j.is_array()) {
      for (const OrderedJson& v : j) refs(v);
    }
  };
  refs(doc);
}

// Text of an HTML dump as Chromium writes it: entities back to characters.
std::string html_text(std::string_view html) {
  std::string out;
  for (size_t i = 0; i < html.size(); ++i) {
    bool replaced = false;
    for (const auto& [entity, c] :
         std::vector<std::pair<std::string_view, std::string_view>>{{"&amp;", "&"},
                                                                    {"&lt;", "<"},
                                                                    {"&gt;", ">"},
                                                                    {"&quot;", "\""},
                                                                    {"&nbsp;", "\u00a0"}}) {
      if (html.substr(i, entity.size()) == entity) {
        out += c;
        i += entity.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += html[i];
  }
  return out;
}

// The value of attribute `name` in the start tag `tag` ("" when absent).
std::string html_attribute(std::string_view tag, const std::string& name) {
  const size_t at = tag.find(" " + name + "=\"");
  if (at == std::string_view::npos) return "";
  const size_t begin = at + name.size() + 3;
  return html_text(tag.substr(begin, tag.find('"', begin) - begin));
}

// Percent-encoding of a query parameter's value.
std::string url_encode(std::string_view text) {
  std::string out;
  for (const unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += char(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

// The playground at `/` in headless Chromium (Debian's package; scripts/install-deps): the page
// fills a document given in its URL and dumps its DOM. Every span of the report — the one the
// library's fill gives the same input — is highlighted over exactly the document's code points at
// its offsets, with its confidence in the mark's title, and the filled JSON shown is the report's
// value. The document starts with accented letters and emoji (two UTF-16 units each), so offsets
// counted in anything but code points land elsewhere.
TEST_F(ServerTest, PlaygroundHighlightsTheReportsSpans) {
  auto page = client().Get("/");
  ASSERT_TRUE(page);
  ASSERT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->get_header_value("Content-Security-Policy").find("default-src 'none'"),
            std::string::npos);
  EXPECT_EQ(page->body.find(">EXAMPLES<"), std::string::npos);  // the examples are in place
  EXPECT_NE(page->body.find("\"name\":\"support\""), std::string::npos);

  ASSERT_EQ(std::system("command -v chromium > /dev/null"), 0)
      << "headless Chromium is needed: run scripts/install-deps";
  const std::string document = "Grüße aus Köln 🧾🧾 — " +
                               testing::read_text(testing::source_path("examples/invoice.txt"));
  const FillResult direct = engine_->fill(invoice_schema(), {document})[0];
  ASSERT_TRUE(direct.ok()) << direct.error;
  const std::string url = fmt::format("http://127.0.0.1:{}/?example=invoice&run=1&document={}",
                                      server_->port(), url_encode(document));
  // --virtual-time-budget: the DOM is dumped once the page is idle (the fill answered) or the
  // budget of virtual time is spent (virtual time stands still while a request is open, so
  // `timeout` bounds a fill that never answers); --no-sandbox: tests may run as root;
  // --disable-dev-shm-usage: containers' /dev/shm is often too small for Chromium.
  const std::string cmd = fmt::format(
      "timeout 300 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage "
      "--no-first-run --user-data-dir='{}' --virtual-time-budget=600000 --dump-dom '{}' > '{}' "
      "2> '{}'",
      (*dir_ / "chromium-profile").string(), url, (*dir_ / "playground.html").string(),
      (*dir_ / "chromium.log").string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << testing::read_text(*dir_ / "chromium.log");
  const std::string dom = testing::read_text(*dir_ / "playground.html");
  ASSERT_NE(dom.find("<body data-state=\"done\">"), std::string::npos) << dom.substr(0, 4000);

  // The document view: plain text and <mark data-fields="i j ...">, in order.
  const size_t open = dom.find("<pre id=\"doc\"");
  ASSERT_NE(open, std::string::npos);
  const size_t close = dom.find("</pre>", open);
  std::string shown;
  std::map<int, std::string> marked;  // field index -> its marked text, in document order
  std::map<int, std::string> titles;
  for (size_t at = dom.find('>', open) + 1; at < close;) {
    if (dom.compare(at, 5, "<mark") != 0) {
      const size_t next = std::min(dom.find('<', at), close);
      shown += html_text(std::string_view(dom).substr(at, next - at));
      at = next;
      continue;
    }
    const size_t tag_end = dom.find('>', at);
    const size_t text_end = dom.find("</mark>", tag_end);
    ASSERT_LT(text_end, close);
    const std::string_view tag = std::string_view(dom).substr(at, tag_end - at);
    const std::string text =
        html_text(std::string_view(dom).substr(tag_end + 1, text_end - tag_end - 1));
    std::istringstream fields(html_attribute(tag, "data-fields"));
    for (int i; fields >> i;) {
      marked[i] += text;
      titles[i] = html_attribute(tag, "title");
    }
    shown += text;
    at = text_end + 7;
  }
  EXPECT_EQ(shown, document);
  const std::u32string points = text::utf8_to_u32(document);
  int spans = 0;
  for (size_t i = 0; i < direct.fields.size(); ++i) {
    const FieldReport& f = direct.fields[i];
    if (!f.span) {
      EXPECT_EQ(marked.count(int(i)), 0u) << f.path;
      continue;
    }
    ++spans;
    const auto [start, end] = *f.span;
    std::string expected;
    for (int64_t k = start; k < end; ++k) text::utf8_append(expected, points[size_t(k)]);
    EXPECT_EQ(marked[int(i)], expected) << f.path << " [" << start << ", " << end << ")";
    EXPECT_NE(titles[int(i)].find(f.path + " = "), std::string::npos) << titles[int(i)];
    EXPECT_NE(titles[int(i)].find(fmt::format("confidence {:.1f}%", 100 * f.confidence)),
              std::string::npos)
        << titles[int(i)];
  }
  EXPECT_GT(spans, 0) << "no extract answered with a span: pick another document";
  const size_t value_at = dom.find("<pre id=\"value\">");
  ASSERT_NE(value_at, std::string::npos);
  const size_t value_begin = value_at + 16;
  EXPECT_EQ(OrderedJson::parse(
                html_text(dom.substr(value_begin, dom.find("</pre>", value_begin) - value_begin))),
            direct.value);
}

// More fills than the queue holds: each gets exactly one answer — 200 (and then the same answer
// it gets alone) or 429 with Retry-After — and the server keeps serving; a fill that comes while
// the queue is full is answered 429.
TEST_F(ServerTest, OverloadAnswers429AndNoRequestIsLost) {
  Server tight(*engine_, {.port = 0, .max_queue = 0});
  const OrderedJson schema = invoice_schema();
  const std::string body =
      OrderedJson({{"schema", schema}, {"documents", {documents()[1]}}}).dump();
  const OrderedJson alone = report_to_json(engine_->fill(schema, {documents()[1]})[0]);
  constexpr int kClients = 6;
  std::vector<int> status(kClients, 0);
  std::vector<std::string> answers(kClients), retry(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto r = post("/v1/fill", body, tight);
      if (!r) return;
      status[i] = r->status;
      answers[i] = r->body;
      retry[i] = r->get_header_value("Retry-After");
    });
  }
  for (std::thread& t : threads) t.join();
  int ok = 0;
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(status[i] == 200 || status[i] == 429) << status[i] << " " << answers[i];
    if (status[i] == 200) {
      ++ok;
      EXPECT_EQ(OrderedJson::parse(answers[i])["results"][0], alone);
    } else {
      EXPECT_EQ(retry[i], "1");
      EXPECT_EQ(OrderedJson::parse(answers[i])["error"]["code"], "overloaded");
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_EQ(post("/v1/fill", body, tight)->status, 200);
  // Whatever the timing of the flood: while a long fill has the engine, a fill is refused at once.
  const std::string long_body =
      OrderedJson({{"schema", schema},
                   {"documents", {std::string(6000, 'x') + " Invoice INV-9, total 12.50 EUR."}}})
          .dump();
  int long_status = 0;
  std::thread running([&] { long_status = post("/v1/fill", long_body, tight)->status; });
  for (bool busy = false; !busy;) {
    busy =
        client(tight).Get("/metrics")->body.find("\ndeg_fill_queue_depth 1\n") != std::string::npos;
  }
  auto refused = post("/v1/fill", body, tight);
  running.join();
  EXPECT_EQ(long_status, 200);
  ASSERT_EQ(refused->status, 429) << refused->body;
  EXPECT_EQ(refused->get_header_value("Retry-After"), "1");
}

// A raw TCP connection to the server, for clients that misbehave.
int connect_raw(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

// Clients that stall mid-request or vanish before their answer cost the others nothing: they
// are answered meanwhile, the stalled ones are dropped after the I/O timeout, and the server
// keeps serving.
TEST_F(ServerTest, SlowAndVanishingClientsHurtNoOne) {
  Server s(*engine_, {.port = 0, .threads = 4, .io_timeout_seconds = 1});
  const std::string fill =
      OrderedJson({{"schema", invoice_schema()}, {"documents", {documents()[1]}}}).dump();
  const std::string head = fmt::format(
      "POST /v1/fill HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: {}\r\n\r\n",
      fill.size());
  std::vector<int> stalled;
  for (int i = 0; i < 2; ++i) {
    stalled.push_back(connect_raw(s.port()));
    const std::string part = head + fill.substr(0, 10);  // then nothing more
    ASSERT_EQ(send(stalled.back(), part.data(), part.size(), MSG_NOSIGNAL), ssize_t(part.size()));
  }
  for (int i = 0; i < 3; ++i) {  // whole requests, gone before the answer
    const int fd = connect_raw(s.port());
    const std::string whole = head + fill;
    send(fd, whole.data(), whole.size(), MSG_NOSIGNAL);
    close(fd);
  }
  const OrderedJson alone = report_to_json(engine_->fill(invoice_schema(), {documents()[1]})[0]);
  auto r = post("/v1/fill", fill, s);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(OrderedJson::parse(r->body)["results"][0], alone);
  // The stalled connections are dropped (an answer saying so, or just closed), not kept.
  for (const int fd : stalled) {
    char buffer[4096];
    std::string answer;
    while (const ssize_t n = recv(fd, buffer, sizeof buffer, 0)) {
      if (n < 0) break;
      answer.append(buffer, size_t(n));
    }
    EXPECT_EQ(answer.find("200 OK"), std::string::npos) << answer;
    close(fd);
  }
  EXPECT_EQ(client(s).Get("/healthz")->status, 200);
}

// options.deadline_ms bounds the wait for the engine: past it the request answers 504 without
// being filled; within it the request is filled as usual.
TEST_F(ServerTest, DeadlinesBoundTheWaitForTheEngine) {
  Server s(*engine_, {.port = 0});
  const OrderedJson schema = invoice_schema();
  const std::string long_document = std::string(6000, 'x') + " Invoice INV-9, total 12.50 EUR.";
  int long_status = 0;
  std::thread running([&] {
    long_status = post("/v1/fill",
                       OrderedJson({{"schema", schema}, {"documents", {long_document}}}).dump(), s)
                      ->status;
  });
  // Wait until the long fill has the engine (the queue gauge counts it).
  for (bool busy = false; !busy;) {
    busy = client(s).Get("/metrics")->body.find("\ndeg_fill_queue_depth 1\n") != std::string::npos;
  }
  auto late = post(
      "/v1/fill",
      OrderedJson(
          {{"schema", schema}, {"documents", {documents()[1]}}, {"options", {{"deadline_ms", 0}}}})
          .dump(),
      s);
  auto patient = post("/v1/fill",
                      OrderedJson({{"schema", schema},
                                   {"documents", {documents()[1]}},
                                   {"options", {{"deadline_ms", 600000}}}})
                          .dump(),
                      s);
  running.join();
  EXPECT_EQ(long_status, 200);
  ASSERT_EQ(late->status, 504) << late->body;
  EXPECT_EQ(error_of(late)["code"], "deadline_exceeded");
  ASSERT_EQ(patient->status, 200) << patient->body;
  EXPECT_EQ(OrderedJson::parse(patient->body)["results"][0],
            report_to_json(engine_->fill(schema, {documents()[1]})[0]));
}

// Concurrent fills of two schemas, with different options, wait while a long fill has the engine;
// the engine then takes them all in one call (the forks of both schemas' documents sharing
// micro-batches), and each answer is still bitwise the one its document gets alone.
TEST_F(ServerTest, ConcurrentFillsOfDifferentSchemasShareACallAndAnswerAsAlone) {
  // A connection each for the long fill, the eight and the metrics polls.
  Server shared(*engine_, {.port = 0, .threads = 12});
  const OrderedJson schema = invoice_schema();
  const std::vector<OrderedJson> schemas = {
      schema, schema_load(testing::source_path("examples/support.schema.json").string())};
  constexpr int kClients = 8;
  std::vector<std::string> bodies, answers(kClients);
  std::vector<OrderedJson> alone;
  for (int i = 0; i < kClients; ++i) {
    const OrderedJson& s = schemas[size_t(i % 3 == 2)];
    const bool keep_nulls = i % 2 == 1;
    const std::string doc = fmt::format("Invoice INV-{} from Shop {}, total {}.50 EUR.", i, i, i);
    bodies.push_back(
        OrderedJson(
            {{"schema", s}, {"documents", {doc}}, {"options", {{"keep_nulls", keep_nulls}}}})
            .dump());
    alone.push_back(report_to_json(engine_->fill(s, {doc}, {.keep_nulls = keep_nulls})[0]));
  }
  auto fills_total = [&] {
    const std::string m = client(shared).Get("/metrics")->body;
    const std::string key = "\ndeg_engine_fills_total ";
    const size_t at = m.find(key);
    return at == std::string::npos ? -1 : std::stoll(m.substr(at + key.size()));
  };
  // The long fill must outlast the eight requests' arrival: a fast build may need a longer
  // document, so an attempt whose long fill ended first is repeated with one twice as long.
  bool waited = false;
  for (int64_t chars = 8000; !waited && chars <= 64000; chars *= 2) {
    const int64_t fills_before = fills_total();
    const std::string long_document =
        std::string(size_t(chars), 'x') + " Invoice INV-9, total 12.50 EUR.";
    std::atomic<bool> long_done{false};
    std::thread running([&] {
      post("/v1/fill", OrderedJson({{"schema", schema}, {"documents", {long_document}}}).dump(),
           shared);
      long_done = true;
    });
    for (bool busy = false; !busy;) {
      busy = client(shared).Get("/metrics")->body.find("\ndeg_fill_queue_depth 1\n") !=
             std::string::npos;
    }
    std::vector<int> status(kClients, 0);
    std::vector<std::thread> threads;
    for (int i = 0; i < kClients; ++i) {
      threads.emplace_back([&, i] {
        auto r = post("/v1/fill", bodies[size_t(i)], shared);
        if (!r) return;
        status[size_t(i)] = r->status;
        answers[size_t(i)] = r->body;
      });
    }
    // All of them waiting behind the long fill.
    const std::string all_waiting = fmt::format("\ndeg_fill_queue_depth {}\n", kClients + 1);
    while (!waited && !long_done) {
      waited = client(shared).Get("/metrics")->body.find(all_waiting) != std::string::npos;
    }
    for (std::thread& t : threads) t.join();
    running.join();
    for (int i = 0; i < kClients; ++i) {
      ASSERT_EQ(status[size_t(i)], 200) << answers[size_t(i)];
      EXPECT_EQ(OrderedJson::parse(answers[size_t(i)])["results"][0], alone[size_t(i)]) << i;
    }
    // Waiting together, the eight took one engine call after the long fill's.
    if (waited) {
      EXPECT_EQ(fills_total(), fills_before + 2);
    }
  }
  ASSERT_TRUE(waited) << "the long fill of 64,000 characters ended before all requests waited";
}

// Requests filled in one engine call are answered as each one's documents are finished: a flat
// schema's request while the call still works on a long document's array items and generated
// text.
TEST_F(ServerTest, ARequestIsAnsweredWhenItsDocumentsAreFinished) {
  Server s(*engine_, {.port = 0});
  const OrderedJson heavy_schema = {
      {"type", "object"},
      {"properties",
       {{"items",
         {{"type", "array"},
          {"minItems", 8},
          {"items", {{"type", "object"}, {"properties", {{"name", {{"type", "string"}}}}}}}}},
        {"summary", {{"type", "string"}, {"x-generate", true}, {"maxLength", 200}}}}}};
  const OrderedJson light_schema =
      schema_load(testing::source_path("examples/support.schema.json").string());
  const std::string long_document = std::string(8000, 'x') + " Invoice INV-9, total 12.50 EUR.";
  const std::string light_document = documents()[1];
  auto queued = [&](int n) {
    const std::string line = fmt::format("\ndeg_fill_queue_depth {}\n", n);
    while (client(s).Get("/metrics")->body.find(line) == std::string::npos) {
    }
  };
  // A first long fill holds the engine while the heavy and the light request line up behind it,
  // so that the two share the next call.
  std::thread blocker([&] {
    post("/v1/fill",
         OrderedJson({{"schema", invoice_schema()}, {"documents", {long_document}}}).dump(), s);
  });
  queued(1);
  std::thread heavy([&] {
    post("/v1/fill", OrderedJson({{"schema", heavy_schema}, {"documents", {long_document}}}).dump(),
         s);
  });
  queued(2);
  auto light =
      post("/v1/fill",
           OrderedJson({{"schema", light_schema}, {"documents", {light_document}}}).dump(), s);
  // The heavy fill is still running (admitted, not answered) once the light one has its answer.
  const std::string meanwhile = client(s).Get("/metrics")->body;
  blocker.join();
  heavy.join();
  ASSERT_EQ(light->status, 200) << light->body;
  EXPECT_EQ(OrderedJson::parse(light->body)["results"][0],
            report_to_json(engine_->fill(light_schema, {light_document})[0]));
  EXPECT_NE(meanwhile.find("\ndeg_fill_queue_depth 1\n"), std::string::npos)
      << "the light request was answered with the heavy one\n"
      << meanwhile;
  const std::string m = client(s).Get("/metrics")->body;
  EXPECT_NE(m.find("\ndeg_engine_fills_total 2\n"), std::string::npos) << m;
}

TEST_F(ServerTest, StopAnswersNothingMore) {
  auto s = std::make_unique<Server>(*engine_, ServerOptions{.port = 0});
  const int port = s->port();
  httplib::Client c("127.0.0.1", port);
  EXPECT_EQ(c.Get("/healthz")->status, 200);
  s->stop();
  c.set_connection_timeout(1);
  EXPECT_FALSE(c.Get("/healthz"));
  s.reset();  // a stopped server is destroyed cleanly
  // A port in use is an error naming it.
  Server first(*engine_, {.port = 0});
  try {
    Server second(*engine_, {.port = first.port()});
    FAIL() << "bound a port in use";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(first.port())), std::string::npos)
        << e.what();
  }
}

// The command: it names its port, guards with its key file, and on SIGTERM answers what is in
// flight and exits 0.
TEST_F(ServerTest, ServeCommandStopsCleanlyOnSigterm) {
  testing::write_text(*dir_ / "cli-keys.txt", "cli-key\n");
  const std::string model = (*dir_ / "ckpt").string(), keys = (*dir_ / "cli-keys.txt").string();
  int err[2];
  ASSERT_EQ(pipe(err), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(err[1], STDERR_FILENO);
    close(err[0]);
    execl(DEG_BINARY, DEG_BINARY, "serve", "--model", model.c_str(), "--port", "0",
          "--api-key-file", keys.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(err[1]);
  // Read stderr until the line naming the port (EOF first: the command died).
  std::string text;
  int port = 0;
  char buffer[512];
  while (port == 0) {
    const ssize_t n = read(err[0], buffer, sizeof buffer);
    if (n <= 0) break;
    text.append(buffer, size_t(n));
    const size_t at = text.find("http://127.0.0.1:");
    const size_t end = at == std::string::npos ? at : text.find_first_not_of("0123456789", at + 17);
    if (end != std::string::npos && end < text.size()) port = std::stoi(text.substr(at + 17));
  }
  ASSERT_GT(port, 0) << text;
  httplib::Client c("127.0.0.1", port);
  EXPECT_EQ(c.Get("/healthz")->status, 200);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  auto models = c.Get("/v1/models", {{"Authorization", "Bearer cli-key"}});
  ASSERT_EQ(models->status, 200);
  EXPECT_EQ(OrderedJson::parse(models->body)["data"][0]["id"], "ckpt");
  // A fill in flight when the signal comes is answered before the command exits: a long document
  // keeps it running, and the queue gauge says when it has reached the engine.
  const std::string document = std::string(3000, 'x') + " Invoice INV-9, total 12.50 EUR.";
  const std::string fill =
      OrderedJson({{"schema", invoice_schema()}, {"documents", {document}}}).dump();
  const int fd = connect_raw(port);
  const std::string request = fmt::format(
      "POST /v1/fill HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer cli-key\r\n"
      "Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
      fill.size(), fill);
  ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), ssize_t(request.size()));
  bool in_flight = false;
  for (pollfd answered{.fd = fd, .events = POLLIN}; !in_flight && poll(&answered, 1, 0) == 0;) {
    auto m = c.Get("/metrics", {{"Authorization", "Bearer cli-key"}});
    in_flight = m && m->body.find("\ndeg_fill_queue_depth 1\n") != std::string::npos;
  }
  kill(pid, SIGTERM);
  std::string answer;
  while (const ssize_t n = recv(fd, buffer, sizeof buffer, 0)) {
    if (n < 0) break;
    answer.append(buffer, size_t(n));
  }
  close(fd);
  EXPECT_TRUE(in_flight) << "the fill ended before it was seen running; lengthen the document";
  ASSERT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer.substr(0, 300);
  const OrderedJson results =
      OrderedJson::parse(answer.substr(answer.find("\r\n\r\n") + 4))["results"];
  EXPECT_EQ(results[0], report_to_json(engine_->fill(invoice_schema(), {document})[0]));
  while (const ssize_t n = read(err[0], buffer, sizeof buffer)) {
    if (n < 0) break;
    text.append(buffer, size_t(n));
  }
  close(err[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << text;
  EXPECT_NE(text.find("answering the requests in flight"), std::string::npos) << text;
}

}  // namespace
}  // namespace deg
