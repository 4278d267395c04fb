// Package secagg owns secure aggregation: the protocol of Bonawitz et al.,
// "Practical Secure Aggregation for Privacy-Preserving Machine Learning"
// (CCS 2017), with the sparse neighbour graph of SecAgg+ (Bell et al., CCS
// 2020) as an option, so that an aggregator learns the sum of the sites'
// vectors and nothing else about any one of them, even when some sites drop
// out mid-round.
//
// It owns four things, and no I/O:
//
//   - Quantizer: real vectors to the ring Z_{2^32} (clip, power-of-two
//     scale, unbiased stochastic rounding) with a headroom bound that
//     refuses any configuration whose sum could wrap, and the exact
//     dequantisation of the sum (quantize.go);
//   - the cryptography, all from the standard library: X25519 key agreement
//     (crypto/ecdh), HKDF-SHA256 (crypto/hkdf), AES-256-CTR as the mask PRG
//     and AES-256-GCM for the shares sent through the server (crypto.go),
//     and Shamir threshold sharing over GF(2^256 + 297) (shamir.go);
//   - the protocol as two pure state machines, Client and Server, whose
//     whole state serialises (MarshalBinary, UnmarshalClient,
//     UnmarshalServer) so a daemon can store it after every step and resume
//     after kill -9;
//   - the messages (messages.go) and their compact, versioned binary
//     encoding, whose decoder treats its input as hostile (encoding.go).
//
// Rounds: 0 AdvertiseKeys (each site's two X25519 public keys and a
// commitment to its self-mask seed; the server answers with the KeyList,
// U1), 1 ShareKeys (Shamir shares of the site's mask private key and
// self-mask seed, one AES-GCM box per neighbour; the server forwards each
// site its boxes, the ShareList; the senders form U2), 2 MaskedInput (the
// input plus the self mask plus the pairwise masks, which cancel in the sum;
// the senders form U3; the server answers with the UnmaskRequest), 3
// Unmasking (each survivor reveals, for each site whose shares it holds, the
// self-mask share if that site is in U3 and the mask-key share if not; the
// server reconstructs, checks each secret against the key or commitment
// the site advertised, and removes the masks). The optional consistency
// check round of the paper is not done: docs/privacy.md says why.
//
// Everything is deterministic given the io.Reader each randomised function
// takes (crypto/rand in production, a seeded reader in tests); there are no
// goroutines, globals or clocks. Deadlines are the caller's: it calls
// Server.Advance when a round's messages are in or its time is up.
package secagg
