package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// The model the property tests compare the store with: per device and
// name, the newest assignment wins; at equal times a value beats a
// removal and the greater value the smaller. A PUT is a value for each
// name it sets and a removal of every other name.

var (
	propDevices = []string{"a1", "a2", "a10", "b1", "b2", "b20", "c", "c-1", "c_2", "d9"}
	propNames   = []string{"fleet", "model", "zone", "_x"}
	propValues  = []string{"East", "West", "F-150", "F-250", "a", "b\x00c", "Zürich"}
)

// modelState is one name's state in the model.
type modelState struct {
	at      buckets.Ticks
	removed bool
	value   string
}

// beats reports whether s wins against cur.
func (s modelState) beats(cur modelState) bool {
	if s.at != cur.at {
		return s.at > cur.at
	}
	if s.removed || cur.removed {
		return !s.removed && cur.removed
	}
	return s.value > cur.value
}

// attrModel is the model of every device's attributes.
type attrModel struct {
	known  map[string]bool
	names  map[string]map[string]modelState
	last   map[string]buckets.Ticks
	hasRdg map[string]bool
}

func newAttrModel() *attrModel {
	return &attrModel{known: map[string]bool{}, names: map[string]map[string]modelState{},
		last: map[string]buckets.Ticks{}, hasRdg: map[string]bool{}}
}

// offer applies one name's assignment and reports whether it changed.
func (m *attrModel) offer(dev, name string, s modelState) bool {
	if m.names[dev] == nil {
		m.names[dev] = map[string]modelState{}
	}
	cur, ok := m.names[dev][name]
	if !ok {
		cur = modelState{removed: true}
	}
	if s.beats(cur) {
		m.names[dev][name] = s
		return true
	}
	return false
}

func (m *attrModel) apply(a buckets.Assignment) {
	dev := string(a.Device)
	changed := false
	for _, x := range a.Set {
		changed = m.offer(dev, x.Name, modelState{at: a.At, value: x.Value}) || changed
	}
	for _, n := range a.Remove {
		changed = m.offer(dev, n, modelState{at: a.At, removed: true}) || changed
	}
	if a.Replace {
		for _, n := range propNames {
			if _, in := a.Set.Get(n); !in {
				changed = m.offer(dev, n, modelState{at: a.At, removed: true}) || changed
			}
		}
	}
	if changed {
		m.known[dev] = true
	}
}

// forget models the delete of dev: it is unknown, with no attributes
// and no readings, until an assignment or a reading comes.
func (m *attrModel) forget(dev string) {
	delete(m.known, dev)
	delete(m.names, dev)
	delete(m.last, dev)
	delete(m.hasRdg, dev)
}

// attrs returns dev's attributes in the model.
func (m *attrModel) attrs(dev string) map[string]string {
	out := map[string]string{}
	for n, s := range m.names[dev] {
		if !s.removed {
			out[n] = s.value
		}
	}
	return out
}

// randomAssignment builds a PATCH (sets and removals) or a PUT.
func randomAssignment(rng *rand.Rand) buckets.Assignment {
	a := buckets.Assignment{
		Device: buckets.DeviceID(propDevices[rng.IntN(len(propDevices))]),
		At:     at(time.Duration(rng.IntN(30)) * time.Second),
	}
	m := map[string]string{}
	for _, n := range propNames {
		switch rng.IntN(4) {
		case 0:
			m[n] = propValues[rng.IntN(len(propValues))]
		case 1:
			if !a.Replace {
				a.Remove = append(a.Remove, n)
			}
		}
	}
	a.Set, _ = buckets.NewAttributes(m)
	if rng.IntN(4) == 0 {
		a.Replace, a.Remove = true, nil
	}
	return a
}

// randomMatchers builds zero to three matchers over the names, the
// device ID and the values, including ones that match the empty string.
func randomMatchers(rng *rand.Rand) []*buckets.Matcher {
	names := append([]string{"device", "nosuch"}, propNames...)
	pats := []string{"East", "East|West", "F-.*", ".*", ".+", "a|b\x00c", "", "a.*", "Z.*|F-150", "b\x00c"}
	var ms []*buckets.Matcher
	for range rng.IntN(4) {
		typ := buckets.MatchType(rng.IntN(4))
		name := names[rng.IntN(len(names))]
		v := pats[rng.IntN(len(pats))]
		if typ == buckets.MatchEqual || typ == buckets.MatchNotEqual {
			v = append(propValues, "", "a1", "c-1")[rng.IntN(len(propValues)+3)]
		}
		m, err := buckets.NewMatcher(typ, name, v)
		if err != nil {
			panic(err)
		}
		ms = append(ms, m)
	}
	return ms
}

// randomQuery builds a device query with random matchers, prefix,
// visibility and silence.
func randomQuery(rng *rand.Rand) buckets.DeviceQuery {
	q := buckets.DeviceQuery{Match: randomMatchers(rng), Limit: 1 + rng.IntN(4)}
	switch rng.IntN(4) {
	case 0:
		q.Prefix = []string{"a", "a1", "b", "c", "c-", "z"}[rng.IntN(6)]
	case 1:
		q.After = buckets.DeviceID(propDevices[rng.IntN(len(propDevices))])
	}
	if rng.IntN(3) == 0 {
		q.SilentBefore = at(time.Duration(rng.IntN(10)) * time.Minute)
	}
	if rng.IntN(3) == 0 {
		q.Visible = func(d buckets.DeviceID) bool { return !strings.HasSuffix(string(d), "1") }
	}
	return q
}

// bruteForce lists the devices q selects by reading every device.
func bruteForce(t *testing.T, ts *testStore, q buckets.DeviceQuery) []buckets.DeviceInfo {
	t.Helper()
	var out []buckets.DeviceInfo
	devs := slices.Clone(propDevices)
	slices.Sort(devs)
	for _, d := range devs {
		di, err := ts.Device(context.Background(), buckets.DeviceID(d))
		if errors.Is(err, buckets.ErrNotFound) {
			continue
		}
		require.NoError(t, err)
		if !strings.HasPrefix(d, q.Prefix) || q.After != "" && d <= string(q.After) ||
			q.SilentBefore != 0 && di.LastSeen >= q.SilentBefore || q.Visible != nil && !q.Visible(di.Device) {
			continue
		}
		ok := true
		for _, m := range q.Match {
			v, _ := di.Attributes.Get(m.Name)
			if m.Name == "device" {
				v = d
			}
			ok = ok && m.Matches(v)
		}
		if ok {
			out = append(out, di)
		}
	}
	return out
}

// checkQuery pages through q and compares with the brute force, and
// does the same for the attribute names and values q selects.
func checkQuery(t *testing.T, ts *testStore, q buckets.DeviceQuery, step string) {
	t.Helper()
	ctx := context.Background()
	want := bruteForce(t, ts, q)
	var got []buckets.DeviceInfo
	for page := 0; ; page++ {
		require.Less(t, page, 20, step)
		devs, more, err := ts.Devices(ctx, q)
		require.NoError(t, err)
		got = append(got, devs...)
		if !more {
			break
		}
		require.Len(t, devs, q.Limit, "%s: a page with more is full", step)
		q.After = devs[len(devs)-1].Device
	}
	require.Equal(t, ids(want), ids(got), "%s: %v", step, q.Match)
	require.Equal(t, want, got, step)

	q.After = ""
	want = bruteForce(t, ts, q)
	names, err := ts.AttributeNames(ctx, q)
	require.NoError(t, err)
	wantNames := []string{}
	values := map[string][]string{}
	for _, di := range want {
		for _, a := range di.Attributes {
			if !slices.Contains(wantNames, a.Name) {
				wantNames = append(wantNames, a.Name)
			}
			if !slices.Contains(values[a.Name], a.Value) {
				values[a.Name] = append(values[a.Name], a.Value)
			}
		}
	}
	slices.Sort(wantNames)
	require.Equal(t, wantNames, names, "%s: names of %v", step, q.Match)
	for _, n := range append(propNames, "nosuch") {
		vs, err := ts.AttributeValues(ctx, n, q)
		require.NoError(t, err)
		slices.Sort(values[n])
		require.Equal(t, append([]string{}, values[n]...), vs, "%s: values of %s for %v", step, n, q.Match)
	}
}

func ids(ds []buckets.DeviceInfo) []buckets.DeviceID {
	out := []buckets.DeviceID{}
	for _, d := range ds {
		out = append(out, d.Device)
	}
	return out
}

// checkModel compares every device's attributes and bounds with m.
func checkModel(t *testing.T, ts *testStore, m *attrModel, step string) {
	t.Helper()
	for _, d := range propDevices {
		di, err := ts.Device(context.Background(), buckets.DeviceID(d))
		if !m.known[d] {
			require.ErrorIs(t, err, buckets.ErrNotFound, "%s: %s", step, d)
			continue
		}
		require.NoError(t, err, "%s: %s", step, d)
		require.Equal(t, m.attrs(d), di.Attributes.Map(), "%s: attributes of %s", step, d)
		require.Equal(t, m.last[d], di.LastSeen, "%s: last seen of %s", step, d)
	}
}

// TestAttributeIndexMatchesBruteForce applies random sequences of
// PATCH, PUT, batched assignments, readings, device deletes and
// restarts, and after
// every step checks each device's attributes against the model and
// random queries against a filter over every device.
func TestAttributeIndexMatchesBruteForce(t *testing.T) {
	t.Parallel()
	seeds := 12
	if testing.Short() {
		seeds = 3
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 7))
			ts := newTestStore(t)
			m := newAttrModel()
			for step := range 60 {
				name := propStep(t, rng, &ts, m)
				label := fmt.Sprintf("seed %d step %d (%s)", seed, step, name)
				checkModel(t, ts, m, label)
				for range 4 {
					checkQuery(t, ts, randomQuery(rng), label)
				}
			}
			require.NoError(t, ts.checkAttrIndex(), "entities and records agree")
		})
	}
}

// propStep does one random thing to the store and the model.
func propStep(t *testing.T, rng *rand.Rand, ts **testStore, m *attrModel) string {
	t.Helper()
	switch op := rng.IntN(11); {
	case op < 5:
		a := randomAssignment(rng)
		(*ts).assign(t, a)
		m.apply(a)
		return "assign"
	case op < 7:
		as := make([]buckets.Assignment, 1+rng.IntN(6))
		for i := range as {
			as[i] = randomAssignment(rng)
		}
		(*ts).assign(t, as...)
		for _, a := range as {
			m.apply(a)
		}
		return "batch"
	case op < 9:
		d := propDevices[rng.IntN(len(propDevices))]
		k := at(time.Duration(rng.IntN(10)) * time.Minute)
		(*ts).write(t, reading(d, k, "v", 1))
		m.known[d], m.hasRdg[d] = true, true
		m.last[d] = max(m.last[d], k)
		return "write"
	case op < 10:
		*ts = (*ts).reopen(t)
		return "reopen"
	default:
		d := propDevices[rng.IntN(len(propDevices))]
		_, err := (*ts).DeleteDevice(context.Background(), buckets.DeviceID(d))
		if !m.known[d] {
			require.ErrorIs(t, err, buckets.ErrNotFound, "delete of %s", d)
			return "delete unknown"
		}
		require.NoError(t, err, "delete of %s", d)
		m.forget(d)
		return "delete"
	}
}

// checkAttrIndex runs Check and returns an error when the attribute
// index disagrees with the records.
func (ts *testStore) checkAttrIndex() error {
	rep, err := ts.Check(context.Background(), nil)
	if err != nil {
		return err
	}
	if !rep.Clean() {
		return fmt.Errorf("check: %+v", rep)
	}
	return nil
}

// TestConcurrentAssignConverges assigns from several goroutines while
// others query; the outcome does not depend on the order, so it must
// equal the model of every assignment. Run it with -race.
func TestConcurrentAssignConverges(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	rng := rand.New(rand.NewPCG(1, 2))
	var batches [][]buckets.Assignment
	for range 8 {
		var b []buckets.Assignment
		for range 40 {
			b = append(b, randomAssignment(rng))
		}
		batches = append(batches, b)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, b := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, a := range b {
				assert.NoError(t, ts.Assign(context.Background(), []buckets.Assignment{a}))
			}
		}()
	}
	var readers sync.WaitGroup
	for i := range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _, err := ts.Devices(context.Background(), randomQuery(rng))
				assert.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	m := newAttrModel()
	for _, b := range batches {
		for _, a := range b {
			m.apply(a)
		}
	}
	checkModel(t, ts, m, "after concurrent assignments")
	require.NoError(t, ts.checkAttrIndex())
	ts = ts.reopen(t)
	checkModel(t, ts, m, "after reopening")
}
