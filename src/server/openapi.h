// The OpenAPI 3 description of deg's HTTP API, served at GET /openapi.json.
#pragma once

#include <string_view>

namespace deg::server {

std::string_view openapi_document();

}  // namespace deg::server
