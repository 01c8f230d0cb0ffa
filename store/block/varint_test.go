package block

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// fastVarint must read what binary.Varint reads, consume as many bytes
// and fail where it fails, for every one- and two-byte input (with and
// without bytes after them) and for longer ones.
func TestFastVarintIsVarint(t *testing.T) {
	check := func(b []byte) {
		t.Helper()
		want, n := binary.Varint(b)
		r := reader{b: b}
		got := r.fastVarint("v")
		if n <= 0 {
			if r.err == nil {
				t.Fatalf("% x: read %d, binary.Varint fails", b, got)
			}
			return
		}
		if r.err != nil || got != want || len(r.b) != len(b)-n {
			t.Fatalf("% x: read %d leaving %d bytes (%v), want %d leaving %d", b, got, len(r.b), r.err, want, len(b)-n)
		}
	}
	for x := range 1 << 16 {
		b := []byte{byte(x), byte(x >> 8), 0x55}
		check(b[:1])
		check(b[:2])
		check(b)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100_000 {
		b := binary.AppendVarint(nil, rng.Int64()>>rng.IntN(64))
		check(b)
		check(b[:len(b)-1])
		check(append(b, 0x81, 0x01))
	}
}
