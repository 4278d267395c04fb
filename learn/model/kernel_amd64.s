#include "textflag.h"

// One term of a block: Y8 holds the broadcast a entry, BX points at the b
// row; acc = fma(a, b, acc), one rounding (VFMADD231PD: acc += Y8 * mem).

// func gemm32(m, nb, k int, a *float64, lda, inca int, b *float64, ldb int, c *float64, ldc int, load bool)
TEXT ·gemm32(SB), NOSPLIT, $0-81
	MOVQ m+0(FP), R8
	MOVQ a+24(FP), SI
	MOVQ lda+32(FP), R11
	SHLQ $3, R11
	MOVQ inca+40(FP), R12
	SHLQ $3, R12
	MOVQ b+48(FP), DI
	MOVQ ldb+56(FP), R13
	SHLQ $3, R13
	MOVQ c+64(FP), DX
	MOVQ ldc+72(FP), R14
	SHLQ $3, R14
	VXORPD Y9, Y9, Y9

row32:
	MOVQ nb+8(FP), R15
	MOVQ DX, CX
	MOVQ DI, R9

blk32:
	CMPB load+80(FP), $0
	JEQ  zero32
	VMOVUPD 0(CX), Y0
	VMOVUPD 32(CX), Y1
	VMOVUPD 64(CX), Y2
	VMOVUPD 96(CX), Y3
	VMOVUPD 128(CX), Y4
	VMOVUPD 160(CX), Y5
	VMOVUPD 192(CX), Y6
	VMOVUPD 224(CX), Y7
	JMP  kinit32

zero32:
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	VXORPD Y4, Y4, Y4
	VXORPD Y5, Y5, Y5
	VXORPD Y6, Y6, Y6
	VXORPD Y7, Y7, Y7

kinit32:
	MOVQ SI, AX
	MOVQ R9, BX
	MOVQ k+16(FP), R10

k32:
	VMOVSD   (AX), X8
	VUCOMISD X9, X8
	JNE      term32
	JPC      skip32 // +0 or -0 (a NaN is unordered: PF set, not skipped)

term32:
	VBROADCASTSD X8, Y8
	VFMADD231PD  0(BX), Y8, Y0
	VFMADD231PD  32(BX), Y8, Y1
	VFMADD231PD  64(BX), Y8, Y2
	VFMADD231PD  96(BX), Y8, Y3
	VFMADD231PD  128(BX), Y8, Y4
	VFMADD231PD  160(BX), Y8, Y5
	VFMADD231PD  192(BX), Y8, Y6
	VFMADD231PD  224(BX), Y8, Y7

skip32:
	ADDQ R12, AX
	ADDQ R13, BX
	DECQ R10
	JNZ  k32

	VMOVUPD Y0, 0(CX)
	VMOVUPD Y1, 32(CX)
	VMOVUPD Y2, 64(CX)
	VMOVUPD Y3, 96(CX)
	VMOVUPD Y4, 128(CX)
	VMOVUPD Y5, 160(CX)
	VMOVUPD Y6, 192(CX)
	VMOVUPD Y7, 224(CX)
	ADDQ    $256, CX
	ADDQ    $256, R9
	DECQ    R15
	JNZ     blk32

	ADDQ R11, SI
	ADDQ R14, DX
	DECQ R8
	JNZ  row32
	VZEROUPPER
	RET

// func gemm16m(m, k int, a *float64, lda, inca int, b *float64, ldb int, c *float64, ldc int, load bool, mask *[16]int64)
TEXT ·gemm16m(SB), NOSPLIT, $0-88
	MOVQ m+0(FP), R8
	MOVQ a+16(FP), SI
	MOVQ lda+24(FP), R11
	SHLQ $3, R11
	MOVQ inca+32(FP), R12
	SHLQ $3, R12
	MOVQ b+40(FP), DI
	MOVQ ldb+48(FP), R13
	SHLQ $3, R13
	MOVQ c+56(FP), DX
	MOVQ ldc+64(FP), R14
	SHLQ $3, R14
	MOVQ mask+80(FP), AX
	VMOVDQU 0(AX), Y12
	VMOVDQU 32(AX), Y13
	VMOVDQU 64(AX), Y14
	VMOVDQU 96(AX), Y15
	VXORPD  Y9, Y9, Y9

row16:
	CMPB load+72(FP), $0
	JEQ  zero16
	VMASKMOVPD 0(DX), Y12, Y0
	VMASKMOVPD 32(DX), Y13, Y1
	VMASKMOVPD 64(DX), Y14, Y2
	VMASKMOVPD 96(DX), Y15, Y3
	JMP        kinit16

zero16:
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3

kinit16:
	MOVQ SI, AX
	MOVQ DI, BX
	MOVQ k+8(FP), R10

k16:
	VMOVSD   (AX), X8
	VUCOMISD X9, X8
	JNE      term16
	JPC      skip16

term16:
	VBROADCASTSD X8, Y8
	VMASKMOVPD   0(BX), Y12, Y10
	VMASKMOVPD   32(BX), Y13, Y11
	VFMADD231PD  Y10, Y8, Y0
	VFMADD231PD  Y11, Y8, Y1
	VMASKMOVPD   64(BX), Y14, Y10
	VMASKMOVPD   96(BX), Y15, Y11
	VFMADD231PD  Y10, Y8, Y2
	VFMADD231PD  Y11, Y8, Y3

skip16:
	ADDQ R12, AX
	ADDQ R13, BX
	DECQ R10
	JNZ  k16

	VMASKMOVPD Y0, Y12, 0(DX)
	VMASKMOVPD Y1, Y13, 32(DX)
	VMASKMOVPD Y2, Y14, 64(DX)
	VMASKMOVPD Y3, Y15, 96(DX)

	ADDQ R11, SI
	ADDQ R14, DX
	DECQ R8
	JNZ  row16
	VZEROUPPER
	RET

// func proxStep4(w, gr, a *float64, n4 int, lr, l2, mu float64, ss *[4]float64)
TEXT ·proxStep4(SB), NOSPLIT, $0-64
	MOVQ         w+0(FP), DI
	MOVQ         gr+8(FP), SI
	MOVQ         a+16(FP), DX
	MOVQ         n4+24(FP), CX
	VBROADCASTSD lr+32(FP), Y13
	VBROADCASTSD l2+40(FP), Y14
	VBROADCASTSD mu+48(FP), Y15
	MOVQ         ss+56(FP), AX
	VMOVUPD      (AX), Y12

step4:
	VMOVUPD (DI), Y0
	VMULPD  Y0, Y0, Y3
	VADDPD  Y3, Y12, Y12 // ss += w*w
	VMULPD  Y0, Y14, Y4  // l2*w
	VADDPD  (SI), Y4, Y4 // g + l2*w
	VSUBPD  (DX), Y0, Y5 // w - a
	VMULPD  Y5, Y15, Y5  // mu*(w - a)
	VADDPD  Y5, Y4, Y4   // (g + l2*w) + mu*(w - a)
	VMULPD  Y4, Y13, Y4  // lr*(...)
	VSUBPD  Y4, Y0, Y0   // w - lr*(...)
	VMOVUPD Y0, (DI)
	ADDQ    $32, DI
	ADDQ    $32, SI
	ADDQ    $32, DX
	DECQ    CX
	JNZ     step4

	VMOVUPD Y12, (AX)
	VZEROUPPER
	RET

// Two rows of a at once: each b row of the block is loaded once into
// registers and used by both rows (half the loads of gemm32 per term), each
// row skipping its own zero a entries. Every c element still sums its terms
// in order, one rounding each, as gemm32 and the portable kernel do.

// func gemm2x16(m2, nb, k int, a *float64, lda, inca int, b *float64, ldb int, c *float64, ldc int, load bool)
TEXT ·gemm2x16(SB), NOSPLIT, $0-81
	MOVQ m2+0(FP), R8
	MOVQ a+24(FP), SI
	MOVQ lda+32(FP), R11
	SHLQ $3, R11
	MOVQ inca+40(FP), R12
	SHLQ $3, R12
	MOVQ b+48(FP), DI
	MOVQ ldb+56(FP), R13
	SHLQ $3, R13
	MOVQ c+64(FP), DX
	MOVQ ldc+72(FP), R14
	SHLQ $3, R14
	VXORPD Y9, Y9, Y9

row2:
	MOVQ nb+8(FP), R15
	MOVQ DX, CX
	MOVQ DI, R9

blk2:
	CMPB load+80(FP), $0
	JEQ  zero2
	VMOVUPD 0(CX), Y0
	VMOVUPD 32(CX), Y1
	VMOVUPD 64(CX), Y2
	VMOVUPD 96(CX), Y3
	VMOVUPD 0(CX)(R14*1), Y4
	VMOVUPD 32(CX)(R14*1), Y5
	VMOVUPD 64(CX)(R14*1), Y6
	VMOVUPD 96(CX)(R14*1), Y7
	JMP     kinit2

zero2:
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	VXORPD Y4, Y4, Y4
	VXORPD Y5, Y5, Y5
	VXORPD Y6, Y6, Y6
	VXORPD Y7, Y7, Y7

kinit2:
	MOVQ SI, AX
	MOVQ R9, BX
	MOVQ k+16(FP), R10

k2:
	VMOVSD  (AX), X8
	VMOVSD  (AX)(R11*1), X10
	VMOVUPD 0(BX), Y11
	VMOVUPD 32(BX), Y12
	VMOVUPD 64(BX), Y13
	VMOVUPD 96(BX), Y14
	VUCOMISD X9, X8
	JNE      term2a
	JPC      skip2a // +0 or -0 (a NaN is unordered: PF set, not skipped)

term2a:
	VBROADCASTSD X8, Y8
	VFMADD231PD  Y11, Y8, Y0
	VFMADD231PD  Y12, Y8, Y1
	VFMADD231PD  Y13, Y8, Y2
	VFMADD231PD  Y14, Y8, Y3

skip2a:
	VUCOMISD X9, X10
	JNE      term2b
	JPC      skip2b

term2b:
	VBROADCASTSD X10, Y10
	VFMADD231PD  Y11, Y10, Y4
	VFMADD231PD  Y12, Y10, Y5
	VFMADD231PD  Y13, Y10, Y6
	VFMADD231PD  Y14, Y10, Y7

skip2b:
	ADDQ R12, AX
	ADDQ R13, BX
	DECQ R10
	JNZ  k2

	VMOVUPD Y0, 0(CX)
	VMOVUPD Y1, 32(CX)
	VMOVUPD Y2, 64(CX)
	VMOVUPD Y3, 96(CX)
	VMOVUPD Y4, 0(CX)(R14*1)
	VMOVUPD Y5, 32(CX)(R14*1)
	VMOVUPD Y6, 64(CX)(R14*1)
	VMOVUPD Y7, 96(CX)(R14*1)
	ADDQ    $128, CX
	ADDQ    $128, R9
	DECQ    R15
	JNZ     blk2

	LEAQ (SI)(R11*2), SI
	LEAQ (DX)(R14*2), DX
	DECQ R8
	JNZ  row2
	VZEROUPPER
	RET

// gemm2x16 with AVX-512: two rows over blocks of 32 columns, ZMM registers.

// func gemm2x32z(m2, nb, k int, a *float64, lda, inca int, b *float64, ldb int, c *float64, ldc int, load bool)
TEXT ·gemm2x32z(SB), NOSPLIT, $0-81
	MOVQ m2+0(FP), R8
	MOVQ a+24(FP), SI
	MOVQ lda+32(FP), R11
	SHLQ $3, R11
	MOVQ inca+40(FP), R12
	SHLQ $3, R12
	MOVQ b+48(FP), DI
	MOVQ ldb+56(FP), R13
	SHLQ $3, R13
	MOVQ c+64(FP), DX
	MOVQ ldc+72(FP), R14
	SHLQ $3, R14
	VXORPD Y9, Y9, Y9

row2z:
	MOVQ nb+8(FP), R15
	MOVQ DX, CX
	MOVQ DI, R9

blk2z:
	CMPB load+80(FP), $0
	JEQ  zero2z
	VMOVUPD 0(CX), Z0
	VMOVUPD 64(CX), Z1
	VMOVUPD 128(CX), Z2
	VMOVUPD 192(CX), Z3
	VMOVUPD 0(CX)(R14*1), Z4
	VMOVUPD 64(CX)(R14*1), Z5
	VMOVUPD 128(CX)(R14*1), Z6
	VMOVUPD 192(CX)(R14*1), Z7
	JMP     kinit2z

zero2z:
	VPXORQ Z0, Z0, Z0
	VPXORQ Z1, Z1, Z1
	VPXORQ Z2, Z2, Z2
	VPXORQ Z3, Z3, Z3
	VPXORQ Z4, Z4, Z4
	VPXORQ Z5, Z5, Z5
	VPXORQ Z6, Z6, Z6
	VPXORQ Z7, Z7, Z7

kinit2z:
	MOVQ SI, AX
	MOVQ R9, BX
	MOVQ k+16(FP), R10

k2z:
	VMOVSD  (AX), X8
	VMOVSD  (AX)(R11*1), X10
	VMOVUPD 0(BX), Z11
	VMOVUPD 64(BX), Z12
	VMOVUPD 128(BX), Z13
	VMOVUPD 192(BX), Z14
	VUCOMISD X9, X8
	JNE      term2az
	JPC      skip2az // +0 or -0 (a NaN is unordered: PF set, not skipped)

term2az:
	VBROADCASTSD X8, Z8
	VFMADD231PD  Z11, Z8, Z0
	VFMADD231PD  Z12, Z8, Z1
	VFMADD231PD  Z13, Z8, Z2
	VFMADD231PD  Z14, Z8, Z3

skip2az:
	VUCOMISD X9, X10
	JNE      term2bz
	JPC      skip2bz

term2bz:
	VBROADCASTSD X10, Z10
	VFMADD231PD  Z11, Z10, Z4
	VFMADD231PD  Z12, Z10, Z5
	VFMADD231PD  Z13, Z10, Z6
	VFMADD231PD  Z14, Z10, Z7

skip2bz:
	ADDQ R12, AX
	ADDQ R13, BX
	DECQ R10
	JNZ  k2z

	VMOVUPD Z0, 0(CX)
	VMOVUPD Z1, 64(CX)
	VMOVUPD Z2, 128(CX)
	VMOVUPD Z3, 192(CX)
	VMOVUPD Z4, 0(CX)(R14*1)
	VMOVUPD Z5, 64(CX)(R14*1)
	VMOVUPD Z6, 128(CX)(R14*1)
	VMOVUPD Z7, 192(CX)(R14*1)
	ADDQ    $256, CX
	ADDQ    $256, R9
	DECQ    R15
	JNZ     blk2z

	LEAQ (SI)(R11*2), SI
	LEAQ (DX)(R14*2), DX
	DECQ R8
	JNZ  row2z
	VZEROUPPER
	RET
