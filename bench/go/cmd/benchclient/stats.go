package main

import (
	"sort"
	"time"
)

// Summary describes a series of durations in seconds.
type Summary struct {
	Count int     `json:"count"`
	Total float64 `json:"total_s"`
	Mean  float64 `json:"mean_s"`
	Min   float64 `json:"min_s"`
	P50   float64 `json:"p50_s"`
	P90   float64 `json:"p90_s"`
	P99   float64 `json:"p99_s"`
	Max   float64 `json:"max_s"`
}

func summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	sorted := append([]time.Duration(nil), samples...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	var total time.Duration
	for _, d := range sorted {
		total += d
	}
	at := func(q float64) float64 {
		i := int(q * float64(len(sorted)-1))
		return sorted[i].Seconds()
	}
	return Summary{
		Count: len(sorted),
		Total: total.Seconds(),
		Mean:  total.Seconds() / float64(len(sorted)),
		Min:   sorted[0].Seconds(),
		P50:   at(0.50),
		P90:   at(0.90),
		P99:   at(0.99),
		Max:   sorted[len(sorted)-1].Seconds(),
	}
}
