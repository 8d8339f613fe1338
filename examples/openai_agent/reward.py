"""The grader of the example's episodes (`env.reward_fn="reward:score"`): 1 when the
agent's last answer holds the task's answer, else 0."""


def score(response, task, messages):
  del messages
  return float(task.answer in response)
