package main

// The scaling part of the scenario: sizes, instances, failed creations, deletions.

import (
	"fmt"
	"strings"

	apiv1 "k8s.io/api/core/v1"
)

// instances lists the group's instances, failing the named check on error.
func (s *scenario) instances(name string, ng NodeGroup) []Instance {
	list, err := ng.Nodes()
	if err != nil {
		s.r.fail(name, "Nodes(): %v", err)
		panic(errAbort{name})
	}
	return list
}

func describe(list []Instance) string {
	parts := make([]string, 0, len(list))
	for _, inst := range list {
		st := "no status"
		if inst.Status != nil {
			st = inst.Status.State.String()
			if e := inst.Status.ErrorInfo; e != nil {
				st += fmt.Sprintf(" error{class %d, code %q, %q}", e.ErrorClass, e.ErrorCode, e.ErrorMessage)
			}
		}
		parts = append(parts, inst.Id+" "+st)
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

func (s *scenario) targetIs(name string, ng NodeGroup, want int) bool {
	got, err := ng.TargetSize()
	if err != nil {
		s.r.fail(name, "TargetSize failed (CA aborts its whole loop): %v", err)
		return false
	}
	return s.r.check(name, got == want, "want %d, got %d", want, got)
}

func healthy(inst Instance) bool {
	return inst.Status != nil && inst.Status.ErrorInfo == nil &&
		(inst.Status.State == InstanceRunning || inst.Status.State == InstanceCreating)
}

func (s *scenario) checkScaling() {
	ng := s.groups[s.exp.ScaleGroup]
	start := s.instances("Nodes.initial", ng)
	ownID := providerPrefix + s.own.UUID
	ok := len(start) == 1 && start[0].Id == ownID && start[0].Status != nil &&
		start[0].Status.State == InstanceRunning && start[0].Status.ErrorInfo == nil
	s.r.check("Nodes.initial", ok, "want [%s Running], got %s", ownID, describe(start))
	s.targetIs("TargetSize.initial", ng, len(start))
	s.checkIncrease(ng, len(start))
	s.checkTooLarge(ng)
	s.checkAllCreatesFail(ng)
	s.checkFailedCreation(ng)
	s.checkDeleteReal(ng)
	s.checkDeleteRefused(ng)
	s.checkDecreaseRefused(ng)
}

func (s *scenario) checkIncrease(ng NodeGroup, before int) {
	s.r.mustNoErr("IncreaseSize(2)", ng.IncreaseSize(2), "accepted")
	s.targetIs("TargetSize.afterIncrease", ng, before+2)
	var list []Instance
	done, detail := poll(pollTimeout, func() (bool, string) {
		list = s.instances("Nodes.afterIncrease", ng)
		if len(list) != before+2 {
			return false, describe(list)
		}
		for _, inst := range list {
			if !healthy(inst) {
				return false, describe(list)
			}
		}
		return true, describe(list)
	})
	s.r.require("Nodes.afterIncrease", done, "want %d Running/Creating instances, got %s", before+2, detail)
	for _, inst := range list {
		s.checkRealInstance(ng.Id(), inst)
	}
}

// checkRealInstance: the id is exactly the providerID the CCM writes, of a server of ours.
func (s *scenario) checkRealInstance(group string, inst Instance) {
	name := "Instance[" + inst.Id + "]"
	if !s.r.check(name+".id", providerIDPattern.MatchString(inst.Id),
		"want cloudscale://<lowercase uuid>, got %q", inst.Id) {
		return
	}
	srv, err := s.admin.server(strings.TrimPrefix(inst.Id, providerPrefix))
	ok := err == nil && srv != nil && srv.Tags[tagCluster] == s.exp.Cluster && srv.Tags[tagGroup] == group
	s.r.check(name+".server", ok, "a server tagged %s=%s %s=%s exists (err %v, server %+v)",
		tagCluster, s.exp.Cluster, tagGroup, group, err, srv)
}

func (s *scenario) checkTooLarge(ng NodeGroup) {
	target, err := ng.TargetSize()
	s.r.mustNoErr("TargetSize.beforeTooLarge", err, fmt.Sprint(target))
	delta := ng.MaxSize() - target + 1
	err = ng.IncreaseSize(delta)
	s.r.check(fmt.Sprintf("IncreaseSize(%d).overMax", delta), err != nil,
		"target %d + %d > max %d must fail, got err=%v", target, delta, ng.MaxSize(), err)
	s.targetIs("TargetSize.afterOverMax", ng, target)
}

func findFailed(list []Instance) *Instance {
	for i := range list {
		if list[i].Status != nil && list[i].Status.ErrorInfo != nil {
			return &list[i]
		}
	}
	return nil
}

// checkAllCreatesFail: when the cloud refuses the whole increase, IncreaseSize must fail (CA
// then records a failed scale-up and backs off) and the target must not stay raised.
func (s *scenario) checkAllCreatesFail(ng NodeGroup) {
	target, err := ng.TargetSize()
	s.r.mustNoErr("TargetSize.beforeAllFail", err, fmt.Sprint(target))
	err = s.admin.setFaults(map[string]any{"fail_next_creates": map[string]any{"count": 1, "kind": "capacity"}})
	s.r.mustNoErr("emulator.fault(capacity x1)", err, "the next create fails with insufficient capacity")
	err = ng.IncreaseSize(1)
	_ = s.admin.clearFaults()
	if err == nil {
		// Also valid for CA if the failure is reported as a failed-creation instance instead.
		s.r.info("IncreaseSize(1) with its only create failing was accepted")
		return
	}
	s.r.pass("IncreaseSize(1).allFailed", "error: %v", err)
	s.targetIs("TargetSize.afterAllFailed", ng, target)
}

// checkFailedCreation: one create of two refused for capacity must show up as CA's "failed
// creation" (Creating + error info, class OutOfResources), and CA's cleanup call (DeleteNodes
// with a fake node named by the instance id) must remove it and lower the target.
func (s *scenario) checkFailedCreation(ng NodeGroup) {
	target, err := ng.TargetSize()
	s.r.mustNoErr("TargetSize.beforeFailedCreate", err, fmt.Sprint(target))
	err = s.admin.setFaults(map[string]any{"fail_next_creates": map[string]any{"count": 1, "kind": "capacity"}})
	s.r.mustNoErr("emulator.fault(capacity x1)", err, "the next create fails with insufficient capacity")
	err = ng.IncreaseSize(2)
	s.r.info("IncreaseSize(2) with one of two creates failing returned err=%v", err)
	var failed *Instance
	done, detail := poll(pollTimeout, func() (bool, string) {
		list := s.instances("Nodes.failedCreation", ng)
		failed = findFailed(list)
		return failed != nil, describe(list)
	})
	_ = s.admin.clearFaults()
	s.r.require("Nodes.failedCreation", done, "an instance with error info appears, got %s", detail)
	st := failed.Status
	s.r.check("failedCreation.state", st.State == InstanceCreating,
		"want Creating (CA only treats Creating+error as a failed creation), got %s", st.State)
	s.r.check("failedCreation.class", st.ErrorInfo.ErrorClass == OutOfResourcesErrorClass,
		"want OutOfResources (%d) for a capacity error, got %d", OutOfResourcesErrorClass, st.ErrorInfo.ErrorClass)
	s.r.check("failedCreation.code", st.ErrorInfo.ErrorCode != "", "errorCode %q, message %q",
		st.ErrorInfo.ErrorCode, st.ErrorInfo.ErrorMessage)
	after, err := ng.TargetSize()
	s.r.mustNoErr("TargetSize.withFailedCreation", err, fmt.Sprint(after))
	fake := nodeFor(failed.Id, failed.Id) // what CA's core sends for it
	s.r.noErr("DeleteNodes(failedCreation)", ng.DeleteNodes([]*apiv1.Node{fake}), "accepted "+failed.Id)
	list := s.instances("Nodes.afterFailedDelete", ng)
	gone := true
	for _, inst := range list {
		gone = gone && inst.Id != failed.Id
	}
	s.r.check("Nodes.afterFailedDelete", gone, "%s is gone, got %s", failed.Id, describe(list))
	s.targetIs("TargetSize.afterFailedDelete", ng, after-1)
	s.r.check("Nodes.count", len(list) == after-1, "one instance per target slot: target %d, got %s",
		after-1, describe(list))
}

func (s *scenario) checkDeleteReal(ng NodeGroup) {
	target, err := ng.TargetSize()
	s.r.mustNoErr("TargetSize.beforeDelete", err, fmt.Sprint(target))
	var victim *Instance
	list := s.instances("Nodes.beforeDelete", ng)
	for i := range list {
		if list[i].Id != providerPrefix+s.own.UUID && healthy(list[i]) {
			victim = &list[i]
		}
	}
	s.r.require("DeleteNodes.victim", victim != nil, "a created instance to delete, from %s", describe(list))
	uuid := strings.TrimPrefix(victim.Id, providerPrefix)
	srv, err := s.admin.server(uuid)
	s.r.require("DeleteNodes.victimServer", err == nil && srv != nil, "server %s exists (err %v)", uuid, err)
	node := nodeFor(srv.Name, victim.Id)
	node.Labels = map[string]string{"node.kubernetes.io/instance-type": srv.Flavor.Slug}
	s.r.mustNoErr("DeleteNodes(real)", ng.DeleteNodes([]*apiv1.Node{node}), "accepted "+victim.Id)
	s.targetIs("TargetSize.afterDelete", ng, target-1)
	after := s.instances("Nodes.afterDelete", ng)
	ok := true
	for _, inst := range after {
		if inst.Id == victim.Id {
			ok = inst.Status != nil && inst.Status.State == InstanceDeleting
		}
	}
	s.r.check("Nodes.afterDelete", ok, "%s is absent or Deleting, got %s", victim.Id, describe(after))
	done, detail := poll(pollTimeout, func() (bool, string) {
		log, err := s.admin.deletions()
		if err != nil {
			return false, err.Error()
		}
		for _, d := range log {
			if d.UUID == uuid && d.By == "api" {
				return true, "deleted through the API"
			}
		}
		return false, fmt.Sprintf("%d deletions, none of %s", len(log), uuid)
	})
	s.r.check("DeleteNodes.cloud", done, "%s", detail)
}

// checkDeleteRefused: a node of another group, or not ours at all, must not be deleted.
func (s *scenario) checkDeleteRefused(ng NodeGroup) {
	other := s.groups[s.exp.OtherGroup]
	if s.exp.OtherGroup == "" || other == nil {
		s.r.info("no otherGroup: cross-group delete not checked")
	} else {
		ownNode := nodeFor(s.own.Name, providerPrefix+s.own.UUID)
		target, _ := other.TargetSize()
		err := other.DeleteNodes([]*apiv1.Node{ownNode})
		s.r.check("DeleteNodes.wrongGroup", err != nil,
			"deleting a %s node through %s must fail, got err=%v", ng.Id(), other.Id(), err)
		s.targetIs("TargetSize.afterWrongGroup["+other.Id()+"]", other, target)
		srv, err := s.admin.server(s.own.UUID)
		s.r.check("DeleteNodes.wrongGroup.cloud", err == nil && srv != nil, "server %s still exists", s.own.UUID)
	}
	target, _ := ng.TargetSize()
	err := ng.DeleteNodes([]*apiv1.Node{nodeFor("ip-10-0-0-1", "aws:///eu-central-1a/i-0123456789abcdef0")})
	s.r.check("DeleteNodes.foreign", err != nil, "deleting a node not of this provider must fail, got err=%v", err)
	s.targetIs("TargetSize.afterForeign", ng, target)
}

// checkDecreaseRefused: every target slot has an instance now, so a decrease would have to
// delete one: the provider must refuse.
func (s *scenario) checkDecreaseRefused(ng NodeGroup) {
	target, err := ng.TargetSize()
	s.r.mustNoErr("TargetSize.beforeDecrease", err, fmt.Sprint(target))
	list := s.instances("Nodes.beforeDecrease", ng)
	existing := 0
	for _, inst := range list {
		if inst.Status == nil || inst.Status.State != InstanceDeleting {
			existing++
		}
	}
	s.r.info("target %d, %d instances not deleting: %s", target, existing, describe(list))
	err = ng.DecreaseTargetSize(-1)
	if existing >= target {
		s.r.check("DecreaseTargetSize(-1).refused", err != nil,
			"target %d with %d instances: a decrease must fail, got err=%v", target, existing, err)
		s.targetIs("TargetSize.afterDecrease", ng, target)
	} else {
		s.r.info("DecreaseTargetSize(-1) with %d pending slots returned err=%v", target-existing, err)
	}
}
