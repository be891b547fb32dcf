package main

// A small client for the emulator's admin API (/_emulator/): seed servers, inject faults,
// read the deletion log. Everything here is set-up and cross-checking; assertions are made
// on what the CA client returns.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

type emulatorAdmin struct {
	base string // http://127.0.0.1:PORT (the /v1 suffix, if given, is dropped)
	http *http.Client
}

func newEmulatorAdmin(url string) *emulatorAdmin {
	base := strings.TrimSuffix(strings.TrimSuffix(url, "/"), "/v1")
	return &emulatorAdmin{base: base, http: &http.Client{Timeout: 10 * time.Second}}
}

type cloudServer struct {
	UUID   string            `json:"uuid"`
	Name   string            `json:"name"`
	Status string            `json:"status"`
	Tags   map[string]string `json:"tags"`
	Flavor struct {
		Slug string `json:"slug"`
	} `json:"flavor"`
}

type deletion struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
	By   string `json:"by"`
}

func (a *emulatorAdmin) do(method, path string, body, out any) error {
	var reader io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		reader = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, a.base+"/_emulator"+path, reader)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s /_emulator%s: HTTP %d: %s", method, path, resp.StatusCode, data)
	}
	if out == nil || len(data) == 0 {
		return nil
	}
	return json.Unmarshal(data, out)
}

func (a *emulatorAdmin) servers() ([]cloudServer, error) {
	var out []cloudServer
	return out, a.do(http.MethodGet, "/servers", nil, &out)
}

func (a *emulatorAdmin) server(uuid string) (*cloudServer, error) {
	all, err := a.servers()
	if err != nil {
		return nil, err
	}
	for i := range all {
		if all[i].UUID == uuid {
			return &all[i], nil
		}
	}
	return nil, nil
}

func (a *emulatorAdmin) createServer(body map[string]any) (cloudServer, error) {
	var out cloudServer
	return out, a.do(http.MethodPost, "/servers", body, &out)
}

func (a *emulatorAdmin) setFaults(faults map[string]any) error {
	return a.do(http.MethodPut, "/faults", faults, nil)
}

func (a *emulatorAdmin) clearFaults() error {
	return a.do(http.MethodDelete, "/faults", nil, nil)
}

func (a *emulatorAdmin) deletions() ([]deletion, error) {
	var out []deletion
	return out, a.do(http.MethodGet, "/deletions", nil, &out)
}
