// OpenAI's chat completions shape (POST /v1/chat/completions), as deg answers it: the schema
// comes from response_format {"type": "json_schema", "json_schema": {"schema": ...}}, the
// document is the last user message, and the answer is the filled JSON as the assistant's
// content — plain (chat.completion) or as server-sent events (chat.completion.chunk).
#pragma once

#include <cstdint>
#include <string>

#include "deg/json.h"

namespace deg::server {

struct ChatRequest {
  OrderedJson schema;
  std::string document;
  bool stream = false;
};

// Throws deg::Error (invalid_argument) naming the member at fault and what deg needs instead.
ChatRequest chat_request_parse(const OrderedJson& body);

struct ChatAnswer {
  std::string id;     // "chatcmpl-<request id>"
  std::string model;  // the served model's name
  int64_t created = 0;
  std::string content;  // the filled JSON, as text
};

// {"id", "object": "chat.completion", "created", "model", "choices": [{"index": 0, "message":
// {"role": "assistant", "content", "refusal": null}, "logprobs": null, "finish_reason":
// "stop"}]}
OrderedJson chat_completion(const ChatAnswer& answer);
// The same as SSE: a role chunk, a content chunk, a finish chunk, then "data: [DONE]".
std::string chat_completion_events(const ChatAnswer& answer);

}  // namespace deg::server
