// deg fill: the main job. The engine (schema plan, backbone, heads) is not in this build yet, so
// the command explains what is missing instead of pretending.
#include "cli/commands.h"
#include "core/error.h"

namespace deg::cli {

void add_fill_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("fill", "Fill a JSON Schema from each document; JSON to stdout.");
  auto schema = std::make_shared<std::string>();
  auto model = std::make_shared<std::string>();
  auto docs = std::make_shared<std::vector<std::string>>();
  cmd->add_option("--schema", *schema, "JSON Schema file")->required();
  cmd->add_option("--model", *model, "HF snapshot or deg checkpoint (default: the embedded model)");
  cmd->add_option("DOC", *docs, "Document files");
  cmd->callback([schema, model, docs] {
    if (model->empty()) {
      throw Error(ErrorKind::not_found,
                  "this build has no embedded default model yet (deg trains its own; see README "
                  "'Status'); pass --model DIR with an HF snapshot or a deg checkpoint");
    }
    throw Error(ErrorKind::unsupported,
                "the fill engine (schema plan, backbone, heads) is not in this build yet; "
                "`deg inspect " +
                    *model + "` shows what the model directory holds");
  });
}

}  // namespace deg::cli
