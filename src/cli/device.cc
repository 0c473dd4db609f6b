// --device: which backend a command runs its model on.
#include "cli/commands.h"

namespace deg::cli {

CLI::Option* add_device_option(CLI::App* cmd, std::string& device) {
  return cmd
      ->add_option("--device", device,
                   "cpu, cuda, or auto: $DEG_DEVICE when set, else cuda when a GPU is visible, "
                   "else cpu (a model whose family does not run on CUDA yet then runs on the CPU)")
      ->capture_default_str();
}

}  // namespace deg::cli
