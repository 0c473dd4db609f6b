// cuBLASLt is opened at run time (src/kernels/cuda/cublaslt.h), where the build has the CUDA
// backend: no GPU is needed to open the library, so CI runs this. A build that linked it ran its
// initialisers in every process; one that cannot find it must say which library it looked for.
#include <gtest/gtest.h>

#if DEG_HAVE_CUDA
#include <string>

#include "core/error.h"
#include "kernels/cuda/cublaslt.h"

namespace deg::cuda {
namespace {

TEST(CublasLtLibrary, OpensWithEveryEntryPoint) {
  const CublasLt lt = open_cublaslt("");
#define DEG_CUBLASLT_CHECK(name) EXPECT_NE(lt.name, nullptr) << "cublasLt" #name;
  DEG_CUBLASLT_ENTRY_POINTS(DEG_CUBLASLT_CHECK)
#undef DEG_CUBLASLT_CHECK
  // The entry points are the library's: a descriptor made and released through them.
  cublasLtMatmulDesc_t desc = nullptr;
  ASSERT_EQ(lt.MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(desc, nullptr);
  EXPECT_EQ(lt.MatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
}

TEST(CublasLtLibrary, AMissingLibraryIsNamed) {
  const std::string missing = "/nonexistent/libcublasLt.so.13";
  try {
    open_cublaslt(missing);
    FAIL() << "opened " << missing;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--device cpu"), std::string::npos) << e.what();
  }
  // A library without cuBLASLt's entry points (libc: present everywhere) is refused by name.
  try {
    open_cublaslt("libc.so.6");
    FAIL() << "took libc.so.6 for cuBLASLt";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("libc.so.6 has no cublasLtCreate"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace deg::cuda
#endif
