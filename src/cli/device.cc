// --device: which backend a command runs its model on.
#include "cli/commands.h"

namespace deg::cli {

CLI::Option* add_device_option(CLI::App* cmd, std::string& device) {
  return cmd
      ->add_option("--device", device,
                   "cpu, cuda, or auto: $DEG_DEVICE when set, else cuda when a GPU is visible, "
                   "else cpu")
      ->capture_default_str();
}

CLI::Option* add_gemm_option(CLI::App* cmd, std::string& gemm) {
  return cmd
      ->add_option("--gemm", gemm,
                   "The model's dot products: exact (f32), bf16 (activations rounded to bf16, "
                   "f32 accumulation, as a bf16 model runs in HF), or auto: bf16 on a GPU, exact "
                   "on the CPU. Weights stored in f32 always run exact")
      ->check(CLI::IsMember({"auto", "exact", "bf16"}))
      ->capture_default_str();
}

}  // namespace deg::cli
