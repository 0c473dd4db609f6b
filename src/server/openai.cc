// OpenAI chat completions in and out (openai.h).
#include "server/openai.h"

#include <fmt/format.h>

#include "deg/error.h"

namespace deg::server {

namespace {

[[noreturn]] void bad(const std::string& message) {
  throw Error(ErrorKind::invalid_argument, message);
}

// A message's text: a string, or an array of content parts whose "text" parts are joined.
std::string message_text(const OrderedJson& content, size_t index) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    bad(fmt::format("messages[{}].content must be a string or an array of content parts", index));
  }
  std::string text;
  for (const OrderedJson& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      bad(
          fmt::format("messages[{}].content: deg reads only text parts ({{\"type\": \"text\", "
                      "\"text\": ...}})",
                      index));
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

OrderedJson chunk(const ChatAnswer& a, OrderedJson delta, OrderedJson finish_reason) {
  return {{"id", a.id},
          {"object", "chat.completion.chunk"},
          {"created", a.created},
          {"model", a.model},
          {"choices",
           {{{"index", 0},
             {"delta", std::move(delta)},
             {"logprobs", nullptr},
             {"finish_reason", std::move(finish_reason)}}}}};
}

std::string event(const OrderedJson& data) {
  return "data: " + data.dump(-1, ' ', false, OrderedJson::error_handler_t::replace) + "\n\n";
}

}  // namespace

ChatRequest chat_request_parse(const OrderedJson& body) {
  if (!body.is_object()) bad("the request body must be a JSON object");
  ChatRequest out;
  const auto format = body.find("response_format");
  if (format == body.end() || !format->is_object() || format->value("type", "") != "json_schema") {
    bad("deg answers structured output only: pass response_format {\"type\": \"json_schema\", "
        "\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
  }
  const auto spec = format->find("json_schema");
  if (spec == format->end() || !spec->is_object() || !spec->contains("schema") ||
      !(*spec)["schema"].is_object()) {
    bad("response_format.json_schema.schema must be the JSON Schema (an object) to fill");
  }
  out.schema = (*spec)["schema"];
  const auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array()) {
    bad("messages must be an array; the last user message is the document");
  }
  bool found = false;
  for (size_t i = messages->size(); i-- > 0 && !found;) {
    const OrderedJson& m = (*messages)[i];
    if (!m.is_object()) bad(fmt::format("messages[{}] must be an object", i));
    if (m.value("role", "") != "user") continue;
    if (!m.contains("content")) bad(fmt::format("messages[{}] has no content", i));
    out.document = message_text(m["content"], i);
    found = true;
  }
  if (!found) bad("messages hold no user message; the last user message is the document");
  if (const auto stream = body.find("stream"); stream != body.end() && !stream->is_null()) {
    if (!stream->is_boolean()) bad("stream must be true or false");
    out.stream = stream->get<bool>();
  }
  return out;
}

OrderedJson chat_completion(const ChatAnswer& a) {
  return {{"id", a.id},
          {"object", "chat.completion"},
          {"created", a.created},
          {"model", a.model},
          {"choices",
           {{{"index", 0},
             {"message", {{"role", "assistant"}, {"content", a.content}, {"refusal", nullptr}}},
             {"logprobs", nullptr},
             {"finish_reason", "stop"}}}}};
}

std::string chat_completion_events(const ChatAnswer& a) {
  return event(chunk(a, {{"role", "assistant"}, {"content", ""}}, nullptr)) +
         event(chunk(a, {{"content", a.content}}, nullptr)) +
         event(chunk(a, OrderedJson::object(), "stop")) + "data: [DONE]\n\n";
}

}  // namespace deg::server
