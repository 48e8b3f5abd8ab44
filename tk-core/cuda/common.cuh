// tile-kernels: helpers shared by every kernel (include as "tk/common.cuh").
// NVRTC compiles without the C++ standard library, so fixed-width types are defined here.
#pragma once

namespace tk {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed int i32;
typedef signed long long i64;

// Ceiling division for non-negative integers.
template <typename T>
__device__ __forceinline__ constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }

// An unsigned integer type of exactly N bytes (N = 1, 2, 4, 8, 16).
template <int N> struct uint_of_size;
template <> struct uint_of_size<1> { typedef u8 type; };
template <> struct uint_of_size<2> { typedef u16 type; };
template <> struct uint_of_size<4> { typedef u32 type; };
template <> struct uint_of_size<8> { typedef u64 type; };
template <> struct uint_of_size<16> { typedef uint4 type; };

}  // namespace tk
