// The OpenAPI document (openapi.h); docs/serve.md is its prose. Keep the two, and the routes of
// server.cc, in step: server_test checks that every route is described here.
#include "server/openapi.h"

namespace deg::server {

std::string_view openapi_document() {
  return R"json({
  "openapi": "3.0.3",
  "info": {
    "title": "deg",
    "version": "1",
    "description": "Fill JSON Schemas from documents with small language models. Every value carries a calibrated confidence and, when copied from the document, its character span. docs/serve.md describes each endpoint."
  },
  "components": {
    "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    "schemas": {
      "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
          "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
              "message": {"type": "string"},
              "type": {"type": "string"},
              "code": {"type": "string"},
              "pointer": {"type": "string", "description": "JSON pointer into the schema, for an unsupported schema"}
            }
          }
        }
      },
      "Document": {
        "description": "A document: its text, {\"document\": text}, or {\"parts\": [{\"text\": ...}]}",
        "oneOf": [
          {"type": "string"},
          {"type": "object", "required": ["document"], "properties": {"document": {"type": "string"}}},
          {"type": "object", "required": ["parts"], "properties": {"parts": {"type": "array", "items": {"type": "object"}}}}
        ]
      },
      "FillRequest": {
        "type": "object",
        "required": ["schema", "documents"],
        "properties": {
          "schema": {"type": "object", "description": "The JSON Schema to fill"},
          "documents": {"type": "array", "items": {"$ref": "#/components/schemas/Document"}},
          "options": {
            "type": "object",
            "properties": {
              "keep_nulls": {"type": "boolean", "default": false},
              "min_confidence": {"type": "number", "minimum": 0, "maximum": 1, "default": 0},
              "deadline_ms": {"type": "integer", "minimum": 0, "maximum": 86400000, "description": "How long the request may wait for the engine; past it: 504"}
            }
          }
        }
      },
      "FillResponse": {
        "type": "object",
        "required": ["results"],
        "properties": {
          "results": {
            "type": "array",
            "description": "One report per document, in order: the format of docs/report.schema.json",
            "items": {"type": "object"}
          }
        }
      },
      "PlanRequest": {
        "type": "object",
        "required": ["schema"],
        "properties": {
          "schema": {"type": "object"},
          "options": {"type": "object", "properties": {"array_mode": {"type": "string", "enum": ["anchor", "index"]}}}
        }
      },
      "ChatRequest": {
        "type": "object",
        "required": ["messages", "response_format"],
        "properties": {
          "model": {"type": "string"},
          "messages": {"type": "array", "items": {"type": "object", "properties": {"role": {"type": "string"}, "content": {}}}},
          "response_format": {
            "type": "object",
            "required": ["type", "json_schema"],
            "properties": {
              "type": {"type": "string", "enum": ["json_schema"]},
              "json_schema": {"type": "object", "required": ["schema"], "properties": {"name": {"type": "string"}, "schema": {"type": "object"}, "strict": {"type": "boolean"}}}
            }
          },
          "stream": {"type": "boolean", "default": false}
        }
      }
    },
    "responses": {
      "Error": {"description": "An error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    }
  },
  "security": [{"bearer": []}],
  "paths": {
    "/v1/fill": {
      "post": {
        "summary": "Fill a JSON Schema from each document",
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/FillRequest"}}}},
        "responses": {
          "200": {"description": "One report per document (a document that failed carries \"error\")", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/FillResponse"}}}},
          "400": {"$ref": "#/components/responses/Error"},
          "401": {"$ref": "#/components/responses/Error"},
          "413": {"$ref": "#/components/responses/Error"},
          "422": {"$ref": "#/components/responses/Error"},
          "429": {"$ref": "#/components/responses/Error"},
          "504": {"$ref": "#/components/responses/Error"}
        }
      }
    },
    "/v1/plan": {
      "post": {
        "summary": "The compiled field plan of a schema (no model work)",
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PlanRequest"}}}},
        "responses": {
          "200": {"description": "{units, max_units, queries, fields: [...], text}", "content": {"application/json": {"schema": {"type": "object"}}}},
          "400": {"$ref": "#/components/responses/Error"},
          "401": {"$ref": "#/components/responses/Error"},
          "413": {"$ref": "#/components/responses/Error"},
          "422": {"$ref": "#/components/responses/Error"}
        }
      }
    },
    "/v1/models": {
      "get": {
        "summary": "The served model (OpenAI's list shape)",
        "responses": {
          "200": {"description": "{object: list, data: [{id, object: model, owned_by, backbone}]}", "content": {"application/json": {"schema": {"type": "object"}}}},
          "401": {"$ref": "#/components/responses/Error"}
        }
      }
    },
    "/v1/chat/completions": {
      "post": {
        "summary": "OpenAI-style structured output: the last user message is the document, response_format's json_schema the schema",
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatRequest"}}}},
        "responses": {
          "200": {
            "description": "chat.completion (or, with stream: true, chat.completion.chunk events then data: [DONE])",
            "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": {"type": "string"}}}
          },
          "400": {"$ref": "#/components/responses/Error"},
          "401": {"$ref": "#/components/responses/Error"},
          "413": {"$ref": "#/components/responses/Error"},
          "422": {"$ref": "#/components/responses/Error"},
          "429": {"$ref": "#/components/responses/Error"}
        }
      }
    },
    "/": {
      "get": {
        "summary": "The playground: a page to fill a schema from a pasted document and see each value's span and confidence (never needs a key; the page sends one with its fills)",
        "security": [],
        "responses": {"200": {"description": "text/html", "content": {"text/html": {"schema": {"type": "string"}}}}}
      }
    },
    "/healthz": {
      "get": {
        "summary": "Liveness (never needs a key)",
        "security": [],
        "responses": {"200": {"description": "{status: ok}", "content": {"application/json": {"schema": {"type": "object"}}}}}
      }
    },
    "/metrics": {
      "get": {
        "summary": "Prometheus text: requests by route and status, errors by status, documents filled, fill queue depth, latency histogram",
        "responses": {"200": {"description": "text/plain; version=0.0.4", "content": {"text/plain": {"schema": {"type": "string"}}}}, "401": {"$ref": "#/components/responses/Error"}}
      }
    },
    "/openapi.json": {
      "get": {
        "summary": "This document",
        "responses": {"200": {"description": "OpenAPI 3", "content": {"application/json": {"schema": {"type": "object"}}}}, "401": {"$ref": "#/components/responses/Error"}}
      }
    }
  }
})json";
}

}  // namespace deg::server
