// The cooperative-matrix types and calls of *_coopmat.comp, one set per
// extension: build.rs compiles those shaders with -DCOOPMAT_KHR
// (GL_KHR_cooperative_matrix) and -DCOOPMAT_NV (GL_NV_cooperative_matrix);
// these macros are the only difference. 16 x 16 f16 inputs, f32
// accumulators, subgroup scope.
#if defined(COOPMAT_KHR)
#extension GL_KHR_cooperative_matrix : require
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MAT_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define LOAD_ROWS(mat, arr, off, stride) coopMatLoad(mat, arr, off, stride, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_COLS(mat, arr, off, stride) coopMatLoad(mat, arr, off, stride, gl_CooperativeMatrixLayoutColumnMajor)
#define STORE_ROWS(mat, arr, off, stride) coopMatStore(mat, arr, off, stride, gl_CooperativeMatrixLayoutRowMajor)
#define MUL_ADD(a, b, c) coopMatMulAdd(a, b, c)
#elif defined(COOPMAT_NV)
#extension GL_NV_cooperative_matrix : require
#define MAT_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define LOAD_ROWS(mat, arr, off, stride) coopMatLoadNV(mat, arr, off, stride, false)
#define LOAD_COLS(mat, arr, off, stride) coopMatLoadNV(mat, arr, off, stride, true)
#define STORE_ROWS(mat, arr, off, stride) coopMatStoreNV(mat, arr, off, stride, false)
#define MUL_ADD(a, b, c) coopMatMulAddNV(a, b, c)
#else
#error "compile with -DCOOPMAT_KHR or -DCOOPMAT_NV"
#endif
