package store

import (
	"context"
	"testing"
	"time"
)

// BenchmarkAcquireRelease is what every read and write pays to hold an
// open day table: acquire and release from many goroutines at once.
func BenchmarkAcquireRelease(b *testing.B) {
	s := openBenchStore(b)
	ctx := context.Background()
	if err := s.Write(ctx, series("dev", dayTick(today, time.Hour), time.Second, 1)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t, err := s.acquire(ctx, today, forWrite)
			if err != nil {
				b.Error(err)
				return
			}
			s.release(t)
		}
	})
}
