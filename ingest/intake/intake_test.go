package intake

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/ingesttest"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

const testPartitions = 4

// newTestServer runs a NATS server that fsyncs every write, maps
// <prefix>.<device> to its partition as the embedded server does, and
// has the partition streams with the intake's subjects.
func newTestServer(t testing.TB, edit ...func(*server.Options)) (*server.Server, jetstream.JetStream) {
	t.Helper()
	srv := ingesttest.RunNATS(t, append([]func(*server.Options){func(o *server.Options) { o.SyncAlways = true }}, edit...)...)
	src, dst := partition.Mapping(ingest.DefaultSubjectPrefix, testPartitions)
	require.NoError(t, srv.GlobalAccount().AddMapping(src, dst))
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	c := ingest.DefaultConfig()
	c.Partitions, c.PartitionStreams, c.Intake = testPartitions, true, true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, pc := range c.PerStream() {
		_, err := ingest.EnsureStream(ctx, js, pc, nil)
		require.NoError(t, err)
	}
	return srv, js
}

// startTestIntake runs an intake on its own connection to srv.
func startTestIntake(t testing.TB, srv *server.Server, cfg Config, hook func()) *Intake {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	cfg.Partitions = testPartitions
	in, err := start(nc, cfg, hook)
	require.NoError(t, err)
	t.Cleanup(in.Close)
	return in
}

// newDevice connects a device's JetStream client to srv.
func newDevice(t testing.TB, srv *server.Server) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1<<14))
	require.NoError(t, err)
	return js
}

// stored is the message of stream at seq.
func stored(t *testing.T, js jetstream.JetStream, stream string, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	st, err := js.Stream(context.Background(), stream)
	require.NoError(t, err)
	m, err := st.GetMsg(context.Background(), seq)
	require.NoError(t, err)
	return m
}

// streamMsgs is how many messages the partition streams hold together.
func streamMsgs(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	var n uint64
	for p := range testPartitions {
		st, err := js.Stream(context.Background(), partition.Stream("TELEMETRY", p))
		require.NoError(t, err)
		n += st.CachedInfo().State.Msgs
	}
	return n
}

func TestPublishesAreAckedAfterTheirBatchIsStored(t *testing.T) {
	srv, js := newTestServer(t)
	in := startTestIntake(t, srv, Config{}, nil)
	dev := newDevice(t, srv)
	ctx := context.Background()

	// Many devices at once, as PublishAsync sends them: the intake
	// gathers them into batches.
	const devices, each = 50, 20
	type sent struct {
		device string
		data   string
		fut    jetstream.PubAckFuture
	}
	var all []sent
	for i := range each {
		for d := range devices {
			device := "dev-" + strconv.Itoa(d)
			data := fmt.Sprintf(`{"ts":%d,"v":%d}`, 1795309323456+i, i)
			f, err := dev.PublishMsgAsync(&nats.Msg{Subject: "telemetry." + device, Data: []byte(data),
				Header: nats.Header{"Nats-Msg-Id": []string{device + "-" + strconv.Itoa(i)}}})
			require.NoError(t, err)
			all = append(all, sent{device, data, f})
		}
	}
	select {
	case <-dev.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publishes not acked")
	}
	for _, s := range all {
		select {
		case ack := <-s.fut.Ok():
			p := partition.Of(testPartitions, s.device)
			require.Equal(t, partition.Stream("TELEMETRY", p), ack.Stream)
			m := stored(t, js, ack.Stream, ack.Sequence)
			assert.Equal(t, "telemetry."+strconv.Itoa(p)+"."+s.device, m.Subject, "stored under the subject readers know")
			assert.Equal(t, s.data, string(m.Data))
			assert.Equal(t, s.fut.Msg().Header.Get("Nats-Msg-Id"), m.Header.Get("Nats-Msg-Id"), "message ID forwarded")
		case err := <-s.fut.Err():
			t.Fatalf("publish of %s: %v", s.device, err)
		}
	}
	assert.Equal(t, uint64(devices*each), streamMsgs(t, js), "each publish stored once")
	assert.Positive(t, in.Stats().Batches, "publishes went as batches")

	// A synchronous Publish, as a device sends one at a time.
	ack, err := dev.Publish(ctx, "telemetry.solo", []byte(`{"ts":1,"v":1}`))
	require.NoError(t, err)
	assert.Equal(t, partition.Stream("TELEMETRY", partition.Of(testPartitions, "solo")), ack.Stream)
	assert.Equal(t, `{"ts":1,"v":1}`, string(stored(t, js, ack.Stream, ack.Sequence).Data))
}

func TestConditionalPublishIsAnsweredByTheStream(t *testing.T) {
	srv, _ := newTestServer(t)
	startTestIntake(t, srv, Config{}, nil)
	dev := newDevice(t, srv)
	_, err := dev.Publish(context.Background(), "telemetry.d1", []byte(`{"v":1}`),
		jetstream.WithExpectLastSequence(math.MaxUint64), jetstream.WithRetryAttempts(0))
	var apiErr *jetstream.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, jetstream.JSErrCodeStreamWrongLastSequence, apiErr.ErrorCode)
}

func TestSameMessageIDTwiceIsStoredTwice(t *testing.T) {
	// The streams keep no duplicate window (one device must not suppress
	// another's message by its ID), and a batch never holds one ID twice
	// (the server would refuse the whole batch).
	srv, js := newTestServer(t)
	startTestIntake(t, srv, Config{}, nil)
	dev := newDevice(t, srv)
	var futs []jetstream.PubAckFuture
	for i := range 100 {
		f, err := dev.PublishMsgAsync(&nats.Msg{Subject: "telemetry.d" + strconv.Itoa(i%3), Data: []byte(`{"v":1}`),
			Header: nats.Header{"Nats-Msg-Id": []string{"same"}}})
		require.NoError(t, err)
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case ack := <-f.Ok():
			assert.False(t, ack.Duplicate)
		case err := <-f.Err():
			t.Fatal(err)
		case <-time.After(30 * time.Second):
			t.Fatal("not acked")
		}
	}
	assert.Equal(t, uint64(100), streamMsgs(t, js))
}

func TestFullQueueHandsOnAndKeepsWhatItAcked(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		size int // payload bytes
		room int // publishes the queue takes
	}{
		{"messages", Config{QueueLen: 64}, 10, 64},
		// Each counted as its payload, subject, reply and overhead.
		{"bytes", Config{QueueBytes: 10 * (1000 + 64 + 60)}, 1000, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, js := newTestServer(t)
			var mu sync.Mutex
			hold := make(chan struct{})
			entered := make(chan struct{}, 1)
			holding := false
			in := startTestIntake(t, srv, tc.cfg, func() {
				mu.Lock()
				h := holding
				mu.Unlock()
				if h {
					entered <- struct{}{}
					<-hold
				}
			})
			dev := newDevice(t, srv)
			ctx := context.Background()
			// Another device's readings, acked before the flood.
			var good []*jetstream.PubAck
			for i := range 10 {
				ack, err := dev.Publish(ctx, "telemetry.good", []byte(`{"v":`+strconv.Itoa(i)+`}`))
				require.NoError(t, err)
				good = append(good, ack)
			}
			flooder := ""
			for i := 0; flooder == "" || partition.Of(testPartitions, flooder) != partition.Of(testPartitions, "good"); i++ {
				flooder = "flood-" + strconv.Itoa(i)
			}
			mu.Lock()
			holding = true
			mu.Unlock()
			data := make([]byte, tc.size)
			for i := range data {
				data[i] = 'x'
			}
			first, err := dev.PublishAsync("telemetry."+flooder, data)
			require.NoError(t, err)
			<-entered // the worker holds the first publish
			p := in.parts[partition.Of(testPartitions, flooder)]
			room := tc.room
			if room == 0 {
				// As received: on the mapped subject, one token longer.
				size := msgSize(first.Msg()) + int64(len(strconv.Itoa(p.n))+1)
				room = int(int64(tc.cfg.QueueBytes) / size)
			}
			const extra = 50
			var futs []jetstream.PubAckFuture
			for range room + extra {
				f, err := dev.PublishAsync("telemetry."+flooder, data)
				require.NoError(t, err)
				futs = append(futs, f)
			}
			// The publishes past the bound go to the stream by
			// themselves: acked while the worker is still held.
			for _, f := range futs[room:] {
				select {
				case ack := <-f.Ok():
					assert.Equal(t, p.stream, ack.Stream)
				case err := <-f.Err():
					t.Fatalf("a publish past the bound was refused: %v", err)
				case <-time.After(30 * time.Second):
					t.Fatal("a publish past the bound was not answered")
				}
			}
			assert.Equal(t, room, len(p.q), "the queue holds exactly its bound")
			if tc.cfg.QueueBytes > 0 {
				assert.LessOrEqual(t, p.bytes.Load(), int64(tc.cfg.QueueBytes))
			}
			assert.Equal(t, uint64(10+extra), streamMsgs(t, js), "stored: the other device's and those past the bound")
			mu.Lock()
			holding = false
			mu.Unlock()
			close(hold)
			for _, f := range append([]jetstream.PubAckFuture{first}, futs[:room]...) {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					t.Fatalf("a queued publish was refused: %v", err)
				case <-time.After(30 * time.Second):
					t.Fatal("a queued publish was not acked")
				}
			}
			for i, ack := range good {
				m := stored(t, js, ack.Stream, ack.Sequence)
				assert.Equal(t, `{"v":`+strconv.Itoa(i)+`}`, string(m.Data), "an acked reading of another device stays")
			}
			assert.Equal(t, uint64(10+1+room+extra), streamMsgs(t, js), "each publish stored once")
			assert.Equal(t, int64(extra), in.Stats().Overflowed)
		})
	}
}

func TestCloseAnswersWhatWasQueued(t *testing.T) {
	srv, js := newTestServer(t)
	in := startTestIntake(t, srv, Config{}, nil)
	dev := newDevice(t, srv)
	var futs []jetstream.PubAckFuture
	for i := range 500 {
		f, err := dev.PublishAsync("telemetry.c"+strconv.Itoa(i%7), []byte(`{"v":1}`))
		require.NoError(t, err)
		futs = append(futs, f)
	}
	require.NoError(t, dev.Conn().Flush())
	in.Close()
	acked := 0
	for _, f := range futs {
		select {
		case <-f.Ok():
			acked++
		case err := <-f.Err():
			if !errors.Is(err, nats.ErrNoResponders) {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a publish taken before Close was not answered")
		}
	}
	assert.Equal(t, uint64(acked), streamMsgs(t, js), "every ack is a stored message, nothing else is stored")
}
