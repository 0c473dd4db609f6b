// The playground page `deg serve` answers at `/` (src/server/playground.html, embedded in the
// binary by cmake/embed.cmake): the page with the example schemas and documents of examples/
// put in its EXAMPLES marker.
#pragma once

#include <string>

namespace deg::server {

std::string playground_page();

}  // namespace deg::server
